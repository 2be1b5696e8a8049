#!/bin/bash
# Run 30, call 2: the one-GPU tests of the committed plan kernel that call 1 cut short (its 150 s
# limit), then the prefill timeline at world size 1 with the plan's two new stamps (count sums
# summed, offsets scanned) for the per-token plan and PLAN_PAIRS.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit)"
T0=$(date +%s)
for k in "contract_on_one_gpu and (overlap or register-copy)" "contract_on_one_gpu and plan-pairs" "rounds_and_graphs and plan-pairs"; do
  timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "$k" >> $out/tests.log 2>&1
  echo "pytest -k '$k': rc $? at $(( $(date +%s) - T0 )) s" | tee -a $out/tests.log
done
grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -12
MOE_BACKEND_DEVSO=stamps source scripts/gpu_devso.sh; echo "stamps devso_loaded=$devso_loaded"
for v in 0 1; do
  env ${N}_PLAN_PAIRS=$v timeout 60 python3 scripts/kernel_timeline.py --config deepseek_prefill --world-size 1 --iters 40 >> $out/stamps.txt 2>&1
done
grep -E "events|dispatch\.(send|plan|copy)" $out/stamps.txt
echo "all done at $(( $(date +%s) - T0 )) s"
