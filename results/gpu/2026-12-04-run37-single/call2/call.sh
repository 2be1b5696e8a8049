#!/bin/bash
# Run 37, call 2 (round 50): grids2 = grids with the direct grid 2 blocks larger (the table's
# blocks take no item of the largest call) against grids, DeepSeek decode with an arena per batch
# size, alternately twice; then the sweep (an arena per size, 1-4096 tokens, bf16) on grids2 with
# ITEM_GRIDS on and off, alternately twice, to see every arena size.
set -u
out=$OUT; mkdir -p $out /tmp/w
for v in grids grids2; do gunzip -f .devso/$v.so.gz; done
export MOE_BACKEND_DEVSO=grids2 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 120 bash scripts/gpu_ab_bench.sh /tmp/w/ab_each deepseek_decode_each \
  MOE_BACKEND_DEVSO=grids MOE_BACKEND_DEVSO=grids2 MOE_BACKEND_DEVSO=grids MOE_BACKEND_DEVSO=grids2 > /tmp/w/ab_each.log 2>&1
echo "ab each rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_each/ab.txt
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 330 bash scripts/gpu_ab_bench.sh /tmp/w/ab_sweep deepseek_sweep \
  base ${N}_ITEM_GRIDS=0 base ${N}_ITEM_GRIDS=0 > /tmp/w/ab_sweep.log 2>&1
echo "ab sweep rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_sweep/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab_each ab_each.log ab_sweep ab_sweep.log)
