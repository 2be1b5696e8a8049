#!/bin/bash
# Session 62, one GPU (an H200 came); carry `.commit .devso/pad45.so.gz`.
# The one-GPU test file's first half on `pad45`, in what was left of the budget (380 s; on an H100
# the half took 340-397 s).
set -u
source scripts/gpu_call.sh pad45
step "one-GPU file 1/2 pad45" tests_single_half1_pad45.log 380 env MOE_TEST_SHARD=1/2 python3 -m pytest -q -m gpu \
  -rA tests/gpu/test_nvshmem_single.py
pack
