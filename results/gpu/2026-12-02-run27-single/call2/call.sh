#!/bin/bash
# Device call 2 (run 27, 2ad0f22): the decode timeline with and without SELF_SEND (stamps build).
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=stamps source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
grep -i "does not load\|build" /tmp/w/env.log | head -3
T0=$(date +%s)
for v in 0 1; do
  env ${N}_SELF_SEND=$v timeout 150 python3 scripts/kernel_timeline.py --world-size 1 --tokens 1 128 --iters 200 --out /tmp/w/tl$v.json > $out/timeline_self$v.log 2>&1
done
tail -40 $out/timeline_self1.log
echo "all done at $(( $(date +%s) - T0 )) s"
