#!/bin/bash
# Run 38, call 2 (round 52): the whole combine's PDL-launched receive with a warp per item of the
# call (WIDE_RECV, more blocks than SMs: safe behind PDL, which starts it once every send block has
# started) against the side stream's grid. `wide` = main + round 52 (host code only). DeepSeek
# decode at world size 1, nvlink: the 128-token arena with the default combine (side stream),
# WHOLE_COMBINE=1 and WHOLE_COMBINE=1 WIDE_RECV=0, alternately twice; an arena per batch size,
# default against WHOLE_COMBINE=1. Then the tests of the PDL combine on the build.
set -u
out=$OUT; mkdir -p $out /tmp/w
gunzip -f .devso/wide.so.gz
export MOE_BACKEND_DEVSO=wide MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
W1=${N}_WHOLE_COMBINE=1
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 200 bash scripts/gpu_ab_bench.sh /tmp/w/ab_128 deepseek_decode \
  base $W1 $W1,${N}_WIDE_RECV=0 base $W1 $W1,${N}_WIDE_RECV=0 > /tmp/w/ab_128.log 2>&1
echo "ab 128 rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_128/ab.txt
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 150 bash scripts/gpu_ab_bench.sh /tmp/w/ab_each deepseek_decode_each \
  base $W1 base $W1 > /tmp/w/ab_each.log 2>&1
echo "ab each rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_each/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab_128 ab_128.log ab_each ab_each.log)
source scripts/gpu_env.sh > /dev/null 2>&1
F=tests/gpu/test_nvshmem_single.py
timeout 200 python3 -m pytest -q -m gpu -rA "$F::test_whole_combine_receive_takes_a_warp_per_item" \
  "$F::test_contract_on_one_gpu[pdl-combine]" "$F::test_rounds_and_graphs_on_one_gpu[pdl-combine]" \
  "$F::test_grids_follow_the_largest_call" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed|Error" $out/tests.log | tail -12
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "test_contract_suite_whole_combine_on_one_stream" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -4
