#!/bin/bash
# Session 54 (prepared, not run), one GPU; carry `.commit .devso/pad18.so.gz` (main's kernels,
# round 75 merged). The one-GPU file's second half (MOE_TEST_SHARD=2/2: 397 s in run 48) on main's
# input alignment and round 75 (run 49 call 4 ran the first half on pad15; the padded tests ran on
# pad18 in run 50 call 1).
set -u
source scripts/gpu_call.sh pad18
step "one GPU shard 2/2" tests_single_shard2.log 560 env MOE_TEST_SHARD=2/2 python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem_single.py
