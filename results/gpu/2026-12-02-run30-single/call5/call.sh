#!/bin/bash
# Run 30, call 5: round 40, the plan's phase 2 with a token's ids loaded 8 at a time
# (PLAN_BATCH, on): the plan kernel alone under ncu with and without it, the prefill A/B at world
# size 1 (own tokens, and under SELF_SEND), then the one-GPU tests (register-copy runs
# PLAN_BATCH=0) and EP2 with both ranks on the GPU.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=$devso_loaded"
T0=$(date +%s)
for v in 1 0; do
  env ${N}_PLAN_BATCH=$v timeout 60 ncu --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats \
    -k regex:dispatch_recv_kernel --launch-skip 5 --launch-count 1 --clock-control none -o /tmp/w/plan$v \
    python3 -m moe_backend.cli bench --config deepseek_prefill --backend nvshmem --world-size 1 --iters 5 > /tmp/w/ncu$v.log 2>&1
  ncu -i /tmp/w/plan$v.ncu-rep --page details > $out/plan_details_batch$v.txt 2>&1
  echo "== PLAN_BATCH=$v"; grep -E "Duration|Warp Cycles Per Issued" $out/plan_details_batch$v.txt
done
P=${N}_PLAN_BATCH=0
S=${N}_SELF_SEND=1
AB_BENCH_ARGS="--world-size 1" timeout 120 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_prefill base $P base $P $S $S,$P > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_prefill.txt; (cd /tmp/w/ab && tar cf $out/ab_json.tar *.json); cat $out/ab_prefill.txt
echo "benches done at $(( $(date +%s) - T0 )) s"
timeout 120 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "contract_on_one_gpu and (overlap and not no-overlap or register-copy or self-send and not untagged and not copy-engine) or rounds_and_graphs and overlap" >> $out/tests.log 2>&1
echo "single pytest: rc $? at $(( $(date +%s) - T0 )) s" | tee -a $out/tests.log
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 60 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA -k "without_direct_receive" >> $out/tests.log 2>&1
echo "ep2 shared pytest: rc $? at $(( $(date +%s) - T0 )) s" | tee -a $out/tests.log
grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -10
echo "all done at $(( $(date +%s) - T0 )) s"
