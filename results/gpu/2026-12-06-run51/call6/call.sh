#!/bin/bash
# Session 56, one GPU; carry `.commit .devso/pad25.so.gz .devso/pad28.so.gz`.
# Builds: `pad28` from branch `round83` (round 83 as in call 5, the bulk copies only where the
# call's live send items, about G * rows * S, take at most half the GPU's warps: at world size 1 up
# to 64 tokens; 128 tokens by registers, as main); `pad25` main's kernels (rounds 78-79, 81).
# 1. The padded tests on pad28 (world size 1; EP2 with both ranks on the GPU).
# 2. The decode bench (SELF_SEND=1) cold: pad25, pad28, pad25; then warm: pad25, pad28, pad25.
#    Predicted: call 5's pad27 at 1 and 32 tokens (combine_padded 0.3-0.8 us less, cold and warm),
#    main's at 128 (16.5-16.6 cold, 11.2 warm).
set -u
source scripts/gpu_call.sh pad28
padded_tests pad28
# A hang or failure of the new path: no bench of it (each would wait out its limit).
grep -q "2 passed" "$raw/tests_padded_single_pad28.log" || { echo "pad28 tests failed: no bench"; exit 0; }
decode_bench_ws1 pad25 a
decode_bench_ws1 pad28
decode_bench_ws1 pad25 b
for b in pad25:c pad28: pad25:d; do
  build=${b%%:*} tag=${b#*:}
  use_build "$build"
  step "decode bench ws1 warm $build$tag" "bench_warm_$build$tag.log" 60 env ${N}_SELF_SEND=1 python3 -m moe_backend.cli \
    bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 --warm-inputs \
    --out "$raw/decode_ws1_warm_$build$tag.json"
  grep -E "^nvshmem" "$raw/bench_warm_$build$tag.log"
done
