#!/bin/bash
# Session 62, one GPU (an H200 came); carry `.commit .devso/pad45.so.gz`.
# The padded tests on main's exact build `pad45` (world size 1, then EP2 with both ranks on the GPU).
set -u
source scripts/gpu_call.sh pad45
padded_tests pad45
pack
