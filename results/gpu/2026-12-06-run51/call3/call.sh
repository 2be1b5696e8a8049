#!/bin/bash
# Session 56, one GPU; carry `.commit .devso/pad25.so.gz .devso/padstamps25.so.gz` (main's kernels
# after round 81; the same with stamps).
# Call 2 showed the 128-token padded combine's gap is cold rows (16.5 cold, 11.7 warm), but its warm
# path gathered the filled rows into a new 14.7 MB tensor (dirty lines the combine's stores then
# evict: the padded timeline warm was slower than cold, 14.5 against 12.2 us by events). Now
# `--warm-inputs` touches the filled rows in place (bench.touch_padded_filled_rows: + 0 by
# index_add_, as the expert GEMM leaves them, dirty in L2) and reads every input before the sleep.
# 1. The decode bench (SELF_SEND=1) on pad25, cold, warm, cold. Predicted: combine_padded at 128
#    tokens <= 11.7 us warm (no second copy), the small calls within 0.3 us of call 2's warm.
# 2. The padded timeline warm (padstamps25): the warm 128-token combine's phases.
# 3. The contiguous timeline at 1 token, cold and warm: where the warm small calls' 0.6-1.6 us go
#    (call 2: dispatch 9.6 -> 10.2, combine 7.6 -> 9.2 us warm).
set -u
source scripts/gpu_call.sh pad25
decode_bench_ws1 pad25 a
step "decode bench ws1 warm" bench_warm.log 60 env ${N}_SELF_SEND=1 python3 -m moe_backend.cli bench \
  --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 --warm-inputs --out "$raw/decode_ws1_warm.json"
grep -E "^nvshmem" "$raw/bench_warm.log"
decode_bench_ws1 pad25 b
use_build padstamps25
step "padded timeline warm" timeline_padded_warm.log 90 python3 scripts/kernel_timeline.py --config deepseek_decode \
  --tokens 1 32 128 --iters 100 --world-size 1 --padded --warm-inputs --out "$raw/timeline_padded_warm.json"
grep -E "tokens per rank|combine" "$raw/timeline_padded_warm.log" | head -24
for mode in cold warm; do
  flag=$([ $mode = warm ] && echo --warm-inputs)
  step "contiguous timeline $mode" timeline_$mode.log 90 env ${N}_SELF_SEND=1 python3 scripts/kernel_timeline.py \
    --config deepseek_decode --tokens 1 --iters 100 --world-size 1 $flag --out "$raw/timeline_$mode.json"
  grep -vE "^\[|Warning|warn|^ *return" "$raw/timeline_$mode.log" | head -40
done
