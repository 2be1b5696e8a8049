#!/bin/bash
# Run 37, call 5 (round 51): EP2 on the shared GPU on rows: the tagged-rows suite (every arena,
# split, arenas of at most 20 tokens) and the contract suite with the defaults.
set -u
out=$OUT; mkdir -p $out
gunzip -f .devso/rows.so.gz
export MOE_BACKEND_DEVSO=rows MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 280 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "test_contract_suite_both_transports or test_contract_suite_tagged_rows" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -4
