#!/bin/bash
# Run 29, call 2: where the ranked receive's time goes at world size 1 (DeepSeek prefill):
# the stamps build's kernel timeline and the profiler's per-kernel timeline, ranked against the plan.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=stamps source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=$devso_loaded"
T0=$(date +%s)
for v in 1 0; do
  env ${N}_RANKED_TABLE=$v timeout 80 python3 scripts/kernel_timeline.py --config deepseek_prefill --world-size 1 --iters 40 > $out/stamps_ranked$v.txt 2>&1
  tail -25 $out/stamps_ranked$v.txt
done
echo "stamps done at $(( $(date +%s) - T0 )) s"
MOE_BACKEND_DEVSO=plain source scripts/gpu_devso.sh; echo "plain devso_loaded=$devso_loaded"
for v in 1 0; do
  env ${N}_RANKED_TABLE=$v timeout 80 python3 scripts/profile_timeline.py /tmp/w/tl$v deepseek-prefill --world-size 1 > /tmp/w/tl$v.log 2>&1
  cp /tmp/w/tl$v/timeline.txt $out/profile_ranked$v.txt 2>/dev/null || tail -5 /tmp/w/tl$v.log
  head -12 $out/profile_ranked$v.txt 2>/dev/null
done
echo "all done at $(( $(date +%s) - T0 )) s"
