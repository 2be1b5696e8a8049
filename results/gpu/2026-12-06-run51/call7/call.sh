#!/bin/bash
# Session 56, one GPU; carry `.commit .devso/pad28.so.gz` (main's kernels after round 83).
# The small contiguous calls' warm penalty (run 51 call 3: the 1-token combine 7.5 -> 9.0 us warm,
# its receive kernel +1.0 us; the dispatch 9.5 -> 10.0): does it follow the size of what the warm
# path reads? The contiguous combine's stand-in y has the arena's static rows (G * M * topk: 1,024
# rows, 14.7 MB at M = 128), read whole by the warm path whatever the call's tokens.
# The decode bench (SELF_SEND=1) cold and warm at M = 128 (the preset) and at M = 8 (y 0.9 MB).
# If the penalty is the big read, it is gone (or much smaller) at M = 8.
set -u
source scripts/gpu_call.sh pad28
cfg8=results/gpu/2026-12-06-run51/call7/deepseek_decode_m8.yaml
for run in m128:deepseek_decode:cold m128:deepseek_decode:warm m8:$cfg8:cold m8:$cfg8:warm; do
  IFS=: read -r tag cfg mode <<< "$run"
  flag=$([ "$mode" = warm ] && echo --warm-inputs)
  step "decode bench $tag $mode" "bench_${tag}_$mode.log" 60 env ${N}_SELF_SEND=1 python3 -m moe_backend.cli bench \
    --config "$cfg" --backend nvshmem --world-size 1 --iters 100 --num-tokens 1 8 $flag --out "$raw/decode_${tag}_$mode.json"
  grep -E "^nvshmem" "$raw/bench_${tag}_$mode.log"
done
