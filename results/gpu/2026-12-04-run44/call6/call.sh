#!/bin/bash
# Prepared in run 44 (its device time spent) for the next lease of any GPU: main's build `main46`
# (`scripts/build_device_extension.sh main46`, gzip it; carry `.commit .devso`).
# 1. Round 63 (PUT_TAGGED=1, put's combine partials round-tagged, staged and put with no signal):
#    its contract test with both EP2 ranks on the GPU (two GPUs: drop the shared settings), and
#    the nvlink tagged-partials suite beside it (unchanged kernels, same SASS).
# 2. The grids test as extended after run 44's call 5 (an arena of 32 KB rows: round 62's bound).
set -u
source scripts/gpu_call.sh main46
WS=$(nvidia-smi -L | wc -l)
shared=(); [ "$WS" = 1 ] && shared=(MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2)  # both ranks on the one GPU
step "put tagged tests" tests_put_tagged.log 240 env "${shared[@]}" python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem.py -k "put_tagged_partials or test_contract_suite_tagged_partials"
step "grids tests" tests_grids.log 200 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k "grids_follow"
