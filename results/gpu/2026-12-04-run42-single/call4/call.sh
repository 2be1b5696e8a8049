#!/bin/bash
# Run 42, call 4 (one H200): the prefill's default combine at world size 1 (two kernels at 4096
# source tokens: combine_recv_kernel takes the same receive items as the fused kernel) on main
# (`fromx`) against the warp-wide wait (`warpw`, 48977a5), alternately twice, compared; then
# each with kernels for 24 SMs once.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=warpw MOE_BACKEND_COMMIT=$(cat .commit) MOE_BACKEND_NVSHMEM_BOOTSTRAP=native
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
D=MOE_BACKEND_DEVSO
AB_BENCH_ARGS="--world-size 1 --iters 100" timeout 200 bash scripts/gpu_ab_bench.sh $raw/ab_prefill deepseek_prefill \
  $D=fromx $D=warpw $D=fromx $D=warpw > $raw/ab_prefill.log 2>&1
echo "ab prefill rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_prefill/ab.txt
python3 -m moe_backend.cli compare $raw/ab_prefill/bench_1_${D}_fromx.json $raw/ab_prefill/bench_2_${D}_warpw.json \
  | tee $raw/compare_prefill.txt
tar czf $OUT/call.tgz -C $raw .
AB_BENCH_ARGS="--world-size 1 --iters 100 --sms 24" timeout 150 bash scripts/gpu_ab_bench.sh $raw/ab_prefill_24 \
  deepseek_prefill $D=fromx $D=warpw > $raw/ab_prefill_24.log 2>&1
echo "ab prefill 24 SMs rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_prefill_24/ab.txt
tar czf $OUT/call.tgz -C $raw .
