#!/bin/bash
# Run 39, call 3 (round 53 kept): `bycall` = main + the per-call choice as the default (a whole
# combine by PDL only where the call's wide receive grid passes the side stream's; WHOLE_COMBINE=1
# every call, =0 none). DeepSeek decode at world size 1, nvlink, the 128-token arena: default,
# WHOLE_COMBINE=1 and =0, alternately twice. Then the tests of the choice and of the forced PDL
# combine on one GPU, and on the shared GPU at EP2 the same and the default contract suite.
set -u
out=$OUT; mkdir -p $out /tmp/w
gunzip -f .devso/bycall.so.gz
export MOE_BACKEND_DEVSO=bycall MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 140 bash scripts/gpu_ab_bench.sh /tmp/w/ab_128 deepseek_decode \
  base ${N}_WHOLE_COMBINE=1 ${N}_WHOLE_COMBINE=0 base ${N}_WHOLE_COMBINE=1 ${N}_WHOLE_COMBINE=0 > /tmp/w/ab_128.log 2>&1
echo "ab 128 rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_128/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab_128 ab_128.log)
source scripts/gpu_env.sh > /dev/null 2>&1
F=tests/gpu/test_nvshmem_single.py
timeout 170 python3 -m pytest -q -m gpu -rA "$F::test_whole_combine_by_call" "$F::test_contract_on_one_gpu[pdl-combine]" \
  "$F::test_rounds_and_graphs_on_one_gpu[pdl-combine]" "$F::test_contract_on_one_gpu[overlap]" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -8
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 230 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "test_whole_combine_by_call or test_contract_suite_whole_combine_forced[1] or test_contract_suite_both_transports" \
  > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -8
