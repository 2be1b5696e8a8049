#!/bin/bash
# Session 57 (prepared), one GPU; carry `.commit .devso/pad32.so.gz` (main's kernels after round 84).
# The one-GPU test file's half 2 of 2 (MOE_TEST_SHARD=2/2; ~6 min), as after each merge: round 84's
# step-bulk combine send under every one-GPU variant.
set -u
source scripts/gpu_call.sh pad32
step "one GPU shard 2/2" tests_single_shard2.log 560 env MOE_TEST_SHARD=2/2 python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem_single.py
