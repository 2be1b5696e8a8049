#!/bin/bash
# Run 43 on `nvidia-h200-x2`, call 3 (`fromx`, as call 1): the decode A/Bs at EP2 that PERF_NOTES'
# "Next on a GPU" lists and never ran on two GPUs; nvshmem only, alternately twice.
# 1. The record's 128-token arena: tagged partials (round 49/50: -1.5 us at 1 token at world
#    size 1, twice the link bytes at 128), tagged rows (round 51), the table's direct blocks
#    (default 2) at 1 and 4.
# 2. An arena per decode size: the defaults (1- and 32-token arenas tagged) against none tagged.
# 3-4: below.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=fromx MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--backend nvshmem" timeout 300 bash scripts/gpu_ab_bench.sh $raw/ab_decode deepseek_decode \
  base ${N}_LL_COMBINE=128 ${N}_LL_ROWS=128 ${N}_DIRECT_TABLE_BLOCKS=1 ${N}_DIRECT_TABLE_BLOCKS=4 \
  base ${N}_LL_COMBINE=128 ${N}_LL_ROWS=128 ${N}_DIRECT_TABLE_BLOCKS=1 ${N}_DIRECT_TABLE_BLOCKS=4 > $raw/ab_decode.log 2>&1
echo "ab decode rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_decode/ab.txt
tar czf $OUT/call.tgz -C $raw .
AB_BENCH_ARGS="--backend nvshmem" timeout 200 bash scripts/gpu_ab_bench.sh $raw/ab_each deepseek_decode_each \
  base ${N}_LL_COMBINE=0,${N}_LL_ROWS=0 base ${N}_LL_COMBINE=0,${N}_LL_ROWS=0 > $raw/ab_each.log 2>&1
echo "ab each rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_each/ab.txt
tar czf $OUT/call.tgz -C $raw .
# 3. Call 2's findings at EP2: the fused combine faster in the 1024- and 2048-token arenas too, bulk
#    row loads 6 us faster at 4096, the copy engine's shrinking chunks (0.6) 3 us: the bulk loads
#    in every fused arena, and the decay's neighbours.
AB_BENCH_ARGS="--backend nvshmem" timeout 120 bash scripts/gpu_ab_bench.sh $raw/ab_bulk_each \
  results/gpu/2026-12-04-run43-x2/call3/prefill_fused.yaml ${N}_COMBINE_FUSED=1 ${N}_COMBINE_FUSED=1,${N}_COMBINE_BULK=1 \
  ${N}_COMBINE_FUSED=1 ${N}_COMBINE_FUSED=1,${N}_COMBINE_BULK=1 > $raw/ab_bulk_each.log 2>&1
echo "ab bulk per arena rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_bulk_each/ab.txt
tar czf $OUT/call.tgz -C $raw .
AB_BENCH_ARGS="--backend nvshmem" timeout 150 bash scripts/gpu_ab_bench.sh $raw/ab_decay deepseek_prefill \
  ${N}_CE_DECAY=0.5 ${N}_CE_DECAY=0.6 ${N}_CE_DECAY=0.7 ${N}_CE_DECAY=0.8 \
  ${N}_CE_DECAY=0.5 ${N}_CE_DECAY=0.6 ${N}_CE_DECAY=0.7 ${N}_CE_DECAY=0.8 > $raw/ab_decay.log 2>&1
echo "ab decay rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_decay/ab.txt
tar czf $OUT/call.tgz -C $raw .
# 4. World size 1 (one of the two GPUs): the 4096-token prefill with the fused combine (faster
#    there by 4.5-5 us, run 42) by cp.async and by bulk loads.
AB_BENCH_ARGS="--backend nvshmem --world-size 1 --iters 100" timeout 120 bash scripts/gpu_ab_bench.sh $raw/ab_ws1 deepseek_prefill \
  base ${N}_COMBINE_FUSED=1 ${N}_COMBINE_FUSED=1,${N}_COMBINE_BULK=1 \
  base ${N}_COMBINE_FUSED=1 ${N}_COMBINE_FUSED=1,${N}_COMBINE_BULK=1 > $raw/ab_ws1.log 2>&1
echo "ab ws1 rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_ws1/ab.txt
tar czf $OUT/call.tgz -C $raw .
