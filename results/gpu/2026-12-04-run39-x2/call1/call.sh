#!/bin/bash
# Run 39 on `nvidia-h200-x2` (lent again at the session's end, ~6 min of device time left):
# main 21491dd's kernels (`bycall`) at EP2, the benchmark of record's decode and prefill presets,
# reference (NCCL) and both nvshmem transports, with the 24-SM rows; whatever lands in time.
set -u
out=$OUT; mkdir -p $out
gunzip -f .devso/bycall.so.gz
export MOE_BACKEND_DEVSO=bycall MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
for preset in deepseek_decode deepseek_prefill; do
  timeout 110 python3 -m moe_backend.cli bench --config $preset --backend all --sms 24 --world-size 2 \
    --out "$out/$preset.json" > "$out/$preset.log" 2>&1
  echo "$preset rc $? at $(( $(date +%s) - T0 )) s"; grep -vE "^\s*$" "$out/$preset.log" | tail -14
done
