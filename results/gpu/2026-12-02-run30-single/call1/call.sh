#!/bin/bash
# Run 30, call 1: the plan kernel as committed (a0d968f) on one H200: its default path's tests,
# the PLAN_PAIRS tests (one GPU, then EP2 with both ranks on the GPU), the prefill A/B at world
# size 1 (own tokens, and under SELF_SEND), then the stamps timeline of both plans.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > $out/env.log 2>&1
echo "commit $(cat .commit)"; nvidia-smi -L > $out/smi.txt 2>&1
T0=$(date +%s)
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "contract_on_one_gpu and (overlap or register-copy or plan-pairs or self-send) or (rounds_and_graphs and plan-pairs)" > $out/tests_single.log 2>&1
grep -E "passed|failed|PASSED|FAILED|ERROR" $out/tests_single.log | tail -14
echo "single tests done at $(( $(date +%s) - T0 )) s"
P=${N}_PLAN_PAIRS=1
S=${N}_SELF_SEND=1
AB_BENCH_ARGS="--world-size 1" timeout 170 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_prefill base $P base $P $S $S,$P $S $S,$P > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_prefill.txt; cp /tmp/w/ab/*.json $out/ 2>/dev/null; cat $out/ab_prefill.txt
grep -il "error\|Traceback" /tmp/w/ab/*.log | head -3
echo "benches done at $(( $(date +%s) - T0 )) s"
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA -k "plan_pairs" > $out/tests_ep2_shared.log 2>&1
grep -E "passed|failed|PASSED|FAILED|ERROR" $out/tests_ep2_shared.log | tail -8
echo "ep2 tests done at $(( $(date +%s) - T0 )) s"
MOE_BACKEND_DEVSO=stamps source scripts/gpu_devso.sh; echo "stamps devso_loaded=$devso_loaded"
for v in 0 1; do
  env ${N}_PLAN_PAIRS=$v timeout 60 python3 scripts/kernel_timeline.py --config deepseek_prefill --world-size 1 --iters 40 > $out/stamps_pairs$v.txt 2>&1
done
grep -A12 "dispatch" $out/stamps_pairs0.txt | head -16; grep -A12 "dispatch" $out/stamps_pairs1.txt | head -16
echo "all done at $(( $(date +%s) - T0 )) s"
