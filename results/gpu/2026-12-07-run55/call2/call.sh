#!/bin/bash
# Session 61 (prepared), one GPU; carry `.commit .devso/pad45.so.gz` (main's kernels).
# The warm penalty's control: the small whole contiguous ops are 0.6-1.2 us slower with warm inputs
# (read or rewritten) in every launch form (run 54 call 2), the padded ops not at all. Is it the
# inputs being hot, or the touching kernels run before the sleep? `--warm-by scratch` runs the same
# reads on a buffer of each input's size and leaves the inputs cold. The decode bench (SELF_SEND=1)
# at 1 / 8 / 32 tokens, cold, warm by read, the control, then cold again. Reading: the control as
# cold -> the inputs' warmth costs it; the control as warm -> the kernels between do. The cold rows
# also check `pad45` (main's helpers) against `pad39`'s in run 54 call 4: predicted within 0.2 us.
set -u
source scripts/gpu_call.sh pad45
# MODES: run 56 call 2 runs this script with its own list (`launch`: since 7a8490d).
for mode in ${MODES:-cold read scratch cold2}; do
  flag=$(case $mode in cold*) ;; *) echo --warm-by=$mode ;; esac)
  step "decode bench $mode" "bench_$mode.log" 60 env ${N}_SELF_SEND=1 python3 -m moe_backend.cli bench \
    --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 --num-tokens 1 8 32 $flag \
    --out "$raw/decode_$mode.json"
  grep -E "^nvshmem" "$raw/bench_$mode.log"
done
