#!/bin/bash
# Run 40 on `nvidia-h200-x2`, call 2 (`fromx`, as call 1): the prefill combine's load switches
# (run 39: 22 us slower than run 22) and the dispatch's copy-engine chunks (shrinking, round 27;
# two streams of 8 chunks), never measured at EP2; nvshmem (nvlink) only, alternately twice.
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
