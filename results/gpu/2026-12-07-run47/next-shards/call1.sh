#!/bin/bash
# Session 51 (prepared), one GPU, build `pad8` (main's kernels, rounds 66-67 included); carry
# `.commit .devso/pad8.so.gz`. The whole one-GPU file in three calls (run 46 call 9: 21 of its 53
# tests in 560 s on an H100, the 24 contract variants ~27 s each): part 1 of 3.
set -u
source scripts/gpu_call.sh pad8
step "one-GPU suite part 1/3" tests_single_1.log 560 env MOE_TEST_SHARD=1/3 python3 -m pytest -q -m gpu -rA \
  -o console_output_style=times --durations=10 tests/gpu/test_nvshmem_single.py
grep -E "passed|failed|s call" "$raw/tests_single_1.log" | head -14
