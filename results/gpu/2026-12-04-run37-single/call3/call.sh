#!/bin/bash
# Run 37, call 3 (round 50): the tests on grids2 (the kept form): the grids by the profiler, the
# one-GPU contract (defaults, old grids), EP2 on the shared GPU (contract suite, tagged partials).
set -u
out=$OUT; mkdir -p $out
gunzip -f .devso/grids2.so.gz
export MOE_BACKEND_DEVSO=grids2 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
timeout 200 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k "grids_follow or token-grids or test_contract_on_one_gpu[overlap] or test_contract_on_one_gpu[self-send]" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -12
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "test_contract_suite_both_transports or test_contract_suite_tagged_partials" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -4
