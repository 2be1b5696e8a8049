#!/bin/bash
# Session 64, one GPU; carry `.commit .devso/pad45.so.gz` (main's kernels). 1ao, half 2 of 2.
BUILD=pad45 SHARD=2/2 exec bash results/gpu/2026-12-06-run54/call5/call.sh
