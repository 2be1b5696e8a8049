#!/bin/bash
# Session 57, one GPU; carry `.commit .devso/pad28.so.gz .devso/pad30.so.gz .devso/pad31.so.gz`.
# Call 3 measured pad31's whole combine at 64 tokens 12.1 us against main's 11.6-11.7, though
# there pad31 runs main's code (the receive by PDL, the register send). Noise or the step-bulk
# split phases run before it? The decode bench (SELF_SEND=1) cold at 64 and 128 tokens,
# alternately: pad31, pad28, pad30, pad31, pad28.
set -u
source scripts/gpu_call.sh pad31
for b in pad31:a pad28:a pad30: pad31:b pad28:b; do
  IFS=: read -r build tag <<< "$b"
  use_build "$build"
  step "decode bench ws1 $build$tag" "bench_$build$tag.log" 45 env ${N}_SELF_SEND=1 \
    python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 \
    --num-tokens 64 128 --out "$raw/decode_ws1_$build$tag.json"
  grep -E "^nvshmem" "$raw/bench_$build$tag.log"
done
