#!/bin/bash
# Run 29, call 4: each dispatch kernel alone (ncu serialises them), DeepSeek prefill at world
# size 1: the send with the ranked table and the ranked receive, against the send, plan and copy.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=$devso_loaded"
T0=$(date +%s)
for v in 1 0; do
  [ $v = 1 ] && skip=12 || skip=15
  env ${N}_RANKED_TABLE=$v timeout 150 ncu --set full -k regex:dispatch_ --launch-skip $skip --launch-count 3 --clock-control none -o /tmp/w/r$v python3 -m moe_backend.cli bench --config deepseek_prefill --backend nvshmem --world-size 1 --iters 5 > $out/ncu_ranked$v.log 2>&1
  ncu -i /tmp/w/r$v.ncu-rep --page details > $out/details_ranked$v.txt 2>&1
  echo "== ranked=$v"
  grep -E "^  [a-z_:<>, ]*dispatch_|Duration|DRAM Throughput|Executed Instructions  |Registers Per|Dynamic Shared|Achieved Occupancy" $out/details_ranked$v.txt | grep -v "Estimated" | head -30
  echo "ncu $v done at $(( $(date +%s) - T0 )) s"
done
