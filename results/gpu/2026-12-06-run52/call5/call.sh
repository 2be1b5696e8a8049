#!/bin/bash
# Session 57 (prepared), one GPU; carry `.commit .devso/pad32.so.gz` (main's kernels after round 84).
# The one-GPU test file's half 1 of 2 (MOE_TEST_SHARD=1/2; ~6 min), as after each merge: round 84's
# step-bulk combine send under every one-GPU variant.
set -u
source scripts/gpu_call.sh pad32
step "one GPU shard 1/2" tests_single_shard1.log 560 env MOE_TEST_SHARD=1/2 python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem_single.py
# Added in session 58: main's build itself in the decode bench (run 52 measured it as pad30).
decode_bench_ws1 pad32
