#!/bin/bash
# Session 64, one GPU; carry `.commit .devso/pad45.so.gz` (main's kernels).
# 1ao, half 1 of 2: the whole one-GPU test file on main's build (run 55 call 6 passed its first 25
# tests before the budget cut it). Call 3 is half 2.
BUILD=pad45 SHARD=1/2 exec bash results/gpu/2026-12-06-run54/call5/call.sh
