#!/bin/bash
# Run 38, call 4 (the last of the session's device time): on `wide2`, the tests call 3's time
# limit cut: the new grid test and the default contract (now the PDL combine) at EP2 on the shared
# GPU, the new grid test and the default rounds and graphs on one GPU.
set -u
out=$OUT; mkdir -p $out
gunzip -f .devso/wide2.so.gz
export MOE_BACKEND_DEVSO=wide2
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "test_whole_combine_receive_takes_a_warp_per_item or test_contract_suite_both_transports" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -5
F=tests/gpu/test_nvshmem_single.py
timeout 80 python3 -m pytest -q -m gpu -rA "$F::test_whole_combine_receive_takes_a_warp_per_item" \
  "$F::test_rounds_and_graphs_on_one_gpu[overlap]" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -5
