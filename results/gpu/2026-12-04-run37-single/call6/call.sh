#!/bin/bash
# Run 37, call 6 (round 51, kept form): rows2 = rows with the tagged rows only where rows cross (a
# rank outside the own group, or SELF_SEND). DeepSeek decode with an arena per batch size at
# world size 1, alternately twice: default, LL_ROWS=0, and the cross-rank path (SELF_SEND=1) with
# LL_ROWS default and 0. Then tests on rows2: the slots' contents under SELF_SEND (tagged and
# not), one-GPU contract and rounds, the grids; EP2 on the shared GPU: the contract suite.
set -u
out=$OUT; mkdir -p $out /tmp/w
gunzip -f .devso/rows2.so.gz
export MOE_BACKEND_DEVSO=rows2 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
V="base ${N}_LL_ROWS=0 ${N}_SELF_SEND=1 ${N}_SELF_SEND=1,${N}_LL_ROWS=0"
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 200 bash scripts/gpu_ab_bench.sh /tmp/w/ab_each deepseek_decode_each \
  $V $V > /tmp/w/ab_each.log 2>&1
echo "ab each rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_each/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab_each ab_each.log)
source scripts/gpu_env.sh > /dev/null 2>&1
timeout 200 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k "test_self_send_goes_through_the_slots or test_contract_on_one_gpu[overlap] or test_contract_on_one_gpu[self-send] or test_rounds_and_graphs_on_one_gpu[tagged-rows] or grids_follow" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -10
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 100 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "test_contract_suite_both_transports" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -3
