#!/bin/bash
# Session 59, one GPU; carry `.commit .devso/pad39.so.gz` (main's kernels after round 86).
# The one-GPU test file after the merge, as a quarter (MOE_TEST_SHARD=1/4, interleaved: ~3 min):
# the session's device time left (~320 s after two starts that got no machine) holds no half.
# The other quarters (2/4-4/4, or halves) are the next sessions' first one-GPU calls.
set -u
source scripts/gpu_call.sh pad39
step "one GPU shard 1/4" tests_single_shard1of4.log 240 env MOE_TEST_SHARD=1/4 python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem_single.py
grep -E "passed|failed|error" "$raw/tests_single_shard1of4.log" | tail -3
