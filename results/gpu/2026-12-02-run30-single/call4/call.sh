#!/bin/bash
# Run 30, call 4: the kernels as committed after round 40's removal (the plan as before run 30,
# without the PLAN_PAIRS branch): the one-GPU tests and EP2 with both ranks on the GPU, a
# prefill record at world size 1, then ncu's per-instruction stall samples of the plan kernel
# alone (DeepSeek prefill, world size 1): where its ~12 us go.
set -u
out=$OUT; mkdir -p $out /tmp/w
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=$devso_loaded"
T0=$(date +%s)
timeout 90 ncu --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats --import-source yes \
  -k regex:dispatch_recv_kernel --launch-skip 5 --launch-count 1 --clock-control none -o /tmp/w/plan \
  python3 -m moe_backend.cli bench --config deepseek_prefill --backend nvshmem --world-size 1 --iters 5 > /tmp/w/ncu.log 2>&1
echo "ncu rc $? at $(( $(date +%s) - T0 )) s"; tail -3 /tmp/w/ncu.log
ncu -i /tmp/w/plan.ncu-rep --page details > $out/plan_details.txt 2>&1
ncu -i /tmp/w/plan.ncu-rep --page source --csv --print-source sass > $out/plan_sass.csv 2>&1 || echo "source page rc $?"
wc -c $out/plan_sass.csv; head -c 600 $out/plan_sass.csv; echo
grep -E "Duration|Warp Cycles Per Issued|Block Size|Grid Size" $out/plan_details.txt
AB_BENCH_ARGS="--world-size 1" timeout 60 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_prefill base base > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_prefill.txt; (cd /tmp/w/ab && tar cf $out/ab_json.tar *.json); cat $out/ab_prefill.txt
echo "benches done at $(( $(date +%s) - T0 )) s"
for k in "contract_on_one_gpu and (overlap and not no-overlap or register-copy or self-send and not untagged and not copy-engine)" "rounds_and_graphs and overlap"; do
  timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "$k" >> $out/tests.log 2>&1
  echo "pytest -k '$k': rc $? at $(( $(date +%s) - T0 )) s" | tee -a $out/tests.log
done
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 100 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA -k "without_direct_receive" >> $out/tests.log 2>&1
echo "ep2 shared pytest: rc $? at $(( $(date +%s) - T0 )) s" | tee -a $out/tests.log
grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -10
echo "all done at $(( $(date +%s) - T0 )) s"
