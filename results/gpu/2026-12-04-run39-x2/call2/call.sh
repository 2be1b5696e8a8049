#!/bin/bash
# Run 39 on `nvidia-h200-x2`, call 2 (`bycall`, as call 1): at EP2 the whole combine per call
# (default) against every call by PDL (WHOLE_COMBINE=1) and none (=0), DeepSeek decode, nvshmem
# only, alternately twice; then the sweep (1-4096 tokens, bf16) with its plot, whatever lands in time.
set -u
out=$OUT; mkdir -p $out /tmp/w
gunzip -f .devso/bycall.so.gz
export MOE_BACKEND_DEVSO=bycall MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--backend nvshmem" timeout 100 bash scripts/gpu_ab_bench.sh /tmp/w/ab_ep2 deepseek_decode \
  base ${N}_WHOLE_COMBINE=1 ${N}_WHOLE_COMBINE=0 base ${N}_WHOLE_COMBINE=1 ${N}_WHOLE_COMBINE=0 > /tmp/w/ab_ep2.log 2>&1
echo "ab ep2 rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_ep2/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab_ep2 ab_ep2.log)
source scripts/gpu_env.sh > /dev/null 2>&1
timeout 120 python3 -m moe_backend.cli bench --config deepseek_sweep --backend all --world-size 2 \
  --out "$out/deepseek_sweep.json" --plot "$out/deepseek_sweep.png" > "$out/deepseek_sweep.log" 2>&1
echo "sweep rc $? at $(( $(date +%s) - T0 )) s"; grep -E "^(nvshmem-nvlink|reference) " "$out/deepseek_sweep.log" | head -24
