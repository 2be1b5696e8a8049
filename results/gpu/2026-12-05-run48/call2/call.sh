#!/bin/bash
# Session 52, one GPU, build `pad9`; carry `.commit .devso/pad9.so.gz`. The one-GPU file's second
# half (MOE_TEST_SHARD=2/2), with its slowest tests listed (the contract suite's oracle now computed
# once a case, not once a transport and round).
set -u
source scripts/gpu_call.sh pad9
step "one-GPU suite part 2/2" tests_single_2.log 580 env MOE_TEST_SHARD=2/2 python3 -m pytest -q -m gpu -rA \
  -o console_output_style=times --durations=12 tests/gpu/test_nvshmem_single.py
grep -E "passed|failed|s call" "$raw/tests_single_2.log" | head -16
