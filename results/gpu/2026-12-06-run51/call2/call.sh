#!/bin/bash
# Session 55 (prepared, not run), one GPU; carry `.commit .devso/pad25.so.gz .devso/padstamps25.so.gz`
# (main's kernels after round 81; the same with stamps).
# The padded combine's 128-token gap (queue entry 1u): the bench times it at 16.4 us, the padded
# timeline's events at 12.6 (run 49 call 3, stamps on). The bench runs the contiguous and split ops
# between two padded combines, the timeline only the padded dispatch: the expert output's filled
# rows (1,024 of 14 KB, 14.7 MB at 128 tokens) are likely cold in the one and in L2 in the other.
# `--warm-inputs` now reads them (bench.padded_filled_rows; before, the whole padded y was past
# WARM_MAX_BYTES and not read at all).
# 1. The decode bench (SELF_SEND=1) on pad25, cold, warm, cold. Predicted: combine_padded at 128
#    tokens ~12.5-13.5 us warm against ~16.4 cold; at 1 and 32 tokens within 0.3 us.
# 2. The padded timeline cold and warm (padstamps25): where the warm combine's 128-token time goes
#    (sent - scanned: 6.5 us in run 49 with stamps).
set -u
source scripts/gpu_call.sh pad25
decode_bench_ws1 pad25 a
step "decode bench ws1 warm" bench_warm.log 60 env ${N}_SELF_SEND=1 python3 -m moe_backend.cli bench \
  --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 --warm-inputs --out "$raw/decode_ws1_warm.json"
grep -E "^nvshmem" "$raw/bench_warm.log"
decode_bench_ws1 pad25 b
use_build padstamps25
for mode in cold warm; do
  flag=$([ $mode = warm ] && echo --warm-inputs)
  step "padded timeline $mode" timeline_padded_$mode.log 90 python3 scripts/kernel_timeline.py --config deepseek_decode \
    --tokens 1 32 128 --iters 100 --world-size 1 --padded $flag --out "$raw/timeline_padded_$mode.json"
  grep -E "tokens per rank|combine" "$raw/timeline_padded_$mode.log" | head -24
done
