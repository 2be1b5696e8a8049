#!/bin/bash
# Run 43 on `nvidia-h200` (one GPU; the two-GPU machine no longer lent), call 1 (`bycall2`: main's
# kernels with run 43's defaults and round 59, the 128-token arena's combine tagged by call).
# 1. World size 1, DeepSeek decode in the 128-token arena: round 59 (default) against
#    LL_COMBINE_BY_CALL=0 (the plain instance, as before), alternately twice.
# 2. The one-GPU contract variants that cover run 43's defaults and round 59 (overlap: the fused
#    combine with bulk loads; async-rows; mixed-partials; plain-large-arenas; the default rounds).
# 3. EP2 with both ranks on the GPU: the tagged-partials suite (by call at 4 and 20 tokens), the
#    fused combine (with a cp.async pass), few SMs.
# 4. World size 1, an arena per prefill size: the fused combine (default) against two kernels.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=bycall2 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
N=MOE_BACKEND_NVSHMEM
pack() { tar czf $OUT/call.tgz -C $raw .; }
AB_BENCH_ARGS="--backend nvshmem --world-size 1" timeout 100 bash scripts/gpu_ab_bench.sh $raw/ab_decode deepseek_decode \
  base ${N}_LL_COMBINE_BY_CALL=0 base ${N}_LL_COMBINE_BY_CALL=0 > $raw/ab_decode.log 2>&1
echo "ab decode rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_decode/ab.txt
pack
timeout 170 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k "async-rows or [overlap] or mixed-partials or plain-large-arenas" > $raw/tests_single.log 2>&1
echo "one-GPU tests rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests_single.log | tail -7
pack
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 230 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py \
  -k "tagged_partials or fused_combine or few_sms" > $raw/tests_shared.log 2>&1
echo "EP2 shared-GPU tests rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests_shared.log | tail -5
pack
AB_BENCH_ARGS="--backend nvshmem" timeout 60 bash scripts/gpu_ab_bench.sh $raw/ab_ws1 \
  results/gpu/2026-12-04-run43-x2/call4/prefill_ws1_each.yaml base ${N}_COMBINE_FUSED=0 > $raw/ab_ws1.log 2>&1
echo "ab ws1 rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_ws1/ab.txt
pack
