#!/bin/bash
# Session 55, one GPU; carry `.commit .devso/pad23.so.gz` (rounds 78 and 79 on main's kernels:
# main's build once branch round79 merges; its padded tests passed in call 6). The one-GPU file's
# first half (MOE_TEST_SHARD=1/2); call 7 ran the second.
set -u
source scripts/gpu_call.sh pad23
step "one GPU shard 1/2" tests_single_shard1.log 480 env MOE_TEST_SHARD=1/2 python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem_single.py
