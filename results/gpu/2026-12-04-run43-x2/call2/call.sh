#!/bin/bash
# Run 43 on `nvidia-h200-x2`, call 2 (`fromx`, as call 1): the prefill combine's load switches
# (run 39: 22 us slower than run 22) and the dispatch's copy-engine chunks (shrinking, round 27;
# two streams of 8 chunks), never measured at EP2; nvshmem (nvlink) only, alternately twice;
# then the fused combine below its threshold (round 56), an arena per prefill size.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=fromx MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--backend nvshmem" timeout 200 bash scripts/gpu_ab_bench.sh $raw/ab_prefill deepseek_prefill \
  base ${N}_COMBINE_ASYNC=0 ${N}_COMBINE_BULK=1 ${N}_CE_DECAY=0.6 ${N}_CE_STREAMS=2,${N}_CE_CHUNKS=8 \
  base ${N}_COMBINE_ASYNC=0 ${N}_COMBINE_BULK=1 ${N}_CE_DECAY=0.6 ${N}_CE_STREAMS=2,${N}_CE_CHUNKS=8 > $raw/ab_prefill.log 2>&1
echo "ab prefill rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_prefill/ab.txt
tar czf $OUT/call.tgz -C $raw .
# Round 56's fused combine below its threshold: an arena per size (1024 / 2048 / 4096 tokens, 2048 /
# 4096 / 8192 source tokens), default against COMBINE_FUSED=1 (the 2048-token arena's combine
# fused), alternately twice; round 8 had the two kernels faster there (143.7 against 146.9 us).
AB_BENCH_ARGS="--backend nvshmem" timeout 240 bash scripts/gpu_ab_bench.sh $raw/ab_fused_each \
  results/gpu/2026-12-04-run43-x2/call2/prefill_each.yaml base ${N}_COMBINE_FUSED=1 base ${N}_COMBINE_FUSED=1 \
  > $raw/ab_fused_each.log 2>&1
echo "ab fused per arena rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_fused_each/ab.txt
tar czf $OUT/call.tgz -C $raw .
