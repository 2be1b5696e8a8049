#!/bin/bash
# Session 62, one GPU (an H200 came); carry `.commit .devso/pad45.so.gz .devso/pad39.so.gz`.
# Main's build `pad45` (7ac4fac's helpers: the SASS of `pad39` but for one FADD's place and two
# registers) against `pad39`, the decode bench cold at 1 / 8 / 32 tokens in one call: predicted
# within 0.2 us on every op.
set -u
source scripts/gpu_call.sh pad39
decode_bench_ws1 pad39 "" --num-tokens 1 8 32
decode_bench_ws1 pad45 "" --num-tokens 1 8 32
pack
