#!/bin/bash
# Session 55, one GPU; carry `.commit .devso/pad23.so.gz` (rounds 78 and 79 on main's kernels:
# main's build once branch round79 merges; its padded tests passed in call 6). The one-GPU file's
# second half (MOE_TEST_SHARD=2/2), as call 5 was to run on pad18.
set -u
source scripts/gpu_call.sh pad23
step "one GPU shard 2/2" tests_single_shard2.log 560 env MOE_TEST_SHARD=2/2 python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem_single.py
