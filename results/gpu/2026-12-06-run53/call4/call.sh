#!/bin/bash
# Session 59, one GPU; carry `.commit .devso/pad39.so.gz` (main's kernels after round 86).
# The one-GPU test file's half 1 of 2 (MOE_TEST_SHARD=1/2; ~6 min), as after each merge (the
# session's device time left holds one half; half 2 is the next session's first one-GPU call).
set -u
source scripts/gpu_call.sh pad39
step "one GPU shard 1/2" tests_single_shard1.log 480 env MOE_TEST_SHARD=1/2 python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem_single.py
grep -E "passed|failed|error" "$raw/tests_single_shard1.log" | tail -3
