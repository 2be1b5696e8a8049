#!/bin/bash
# Session 53 (prepared, not run), one GPU; carry `.commit .devso/padstamps15.so.gz .devso/pad15.so.gz`
# (main's kernels, round 72; padstamps15 with the stamps).
# Round 73's stamps: a row's first loads take ~2-2.5 us from issue to data however early they go,
# which reads as x cold after the bench's barrier (500 us of device sleep, an all-reduce). A model's
# step finds x hot (the layer before wrote it). `--warm-inputs` reads each timed call's inputs once
# after its barrier, outside the timing.
# 1. The padded dispatch's stamps with warm inputs. Predicted: copied ~1.5 us from the entry (3.0
#    cold), the kernel ~3.5 (5.2).
# 2. The decode bench at world size 1 (SELF_SEND=1) cold, warm, cold. Predicted: every dispatch ~1-2
#    us less warm; combines less where their y is warmed (the padded combine's 470 MB stand-in y is
#    past bench.WARM_MAX_BYTES: cold in both).
set -u
source scripts/gpu_call.sh padstamps15
step "padded timeline warm" timeline_padded_warm.log 120 python3 scripts/kernel_timeline.py --config deepseek_decode \
  --tokens 1 32 128 --iters 100 --world-size 1 --padded --warm-inputs --out "$raw/timeline_padded_warm.json"
grep -E "tokens per rank|dispatch" "$raw/timeline_padded_warm.log" | head -30
use_build pad15
for run in cold_a warm cold_b; do
  extra=()
  [ "$run" = warm ] && extra=(--warm-inputs)
  step "decode bench ws1 $run" "bench_$run.log" 60 env ${N}_SELF_SEND=1 python3 -m moe_backend.cli bench \
    --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 "${extra[@]}" --out "$raw/decode_ws1_$run.json"
  grep -E "^nvshmem|^dense" "$raw/bench_$run.log"
done
