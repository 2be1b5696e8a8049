#!/bin/bash
# Run 30, call 3: the dispatch copy on the plan's last-block flag (COPY_FLAG, on by default;
# PLAN_PAIRS removed) on one H200: the prefill A/B at world size 1 against COPY_FLAG=0 (own
# tokens, and under SELF_SEND), the one-GPU tests of both paths, EP2 with both ranks on the GPU,
# then the stamps timeline of both.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit)"
T0=$(date +%s)
F=${N}_COPY_FLAG=0
S=${N}_SELF_SEND=1
AB_BENCH_ARGS="--world-size 1" timeout 170 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_prefill base $F base $F $S $S,$F $S $S,$F > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_prefill.txt; (cd /tmp/w/ab && tar cf $out/ab_json.tar *.json); cat $out/ab_prefill.txt
grep -il "error\|Traceback" /tmp/w/ab/*.log | head -3
echo "benches done at $(( $(date +%s) - T0 )) s"
for k in "contract_on_one_gpu and (overlap and not no-overlap or copy-grid-wait or self-send and not untagged and not copy-engine)" "rounds_and_graphs and (overlap or copy-grid-wait or self-send)"; do
  timeout 220 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "$k" >> $out/tests.log 2>&1
  echo "pytest -k '$k': rc $? at $(( $(date +%s) - T0 )) s" | tee -a $out/tests.log
done
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA -k "copy_grid_wait or without_direct_receive" >> $out/tests.log 2>&1
echo "ep2 shared pytest: rc $? at $(( $(date +%s) - T0 )) s" | tee -a $out/tests.log
grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -14
MOE_BACKEND_DEVSO=stamps source scripts/gpu_devso.sh; echo "stamps devso_loaded=$devso_loaded"
for v in 1 0; do
  env ${N}_COPY_FLAG=$v timeout 60 python3 scripts/kernel_timeline.py --config deepseek_prefill --world-size 1 --iters 40 >> $out/stamps.txt 2>&1
done
grep -E "events|dispatch\.(send|plan|copy)" $out/stamps.txt
echo "all done at $(( $(date +%s) - T0 )) s"
