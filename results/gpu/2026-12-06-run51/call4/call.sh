#!/bin/bash
# Session 56, one GPU; carry `.commit .devso/pad25.so.gz .devso/pad26.so.gz`.
# Builds: `pad26` from branch `round82` (round 82: the partials combine's send prefetches each row's
# next-pass chunk into L1 beside this pass's load); `pad25` main's kernels (rounds 78-79, 81).
# 1. The padded tests on pad26 (world size 1; EP2 with both ranks on the GPU).
# 2. The decode bench (SELF_SEND=1) cold: pad25, pad26, pad25; then warm (`--warm-inputs`, the
#    filled rows touched in place): pad25, pad26, pad25. Predicted: combine_padded 0.2-0.4 us less at
#    1 and 32 tokens (a slice's second pass from L1), 0.5-1.5 less at 128 (more cold than warm);
#    dispatch_padded and the contiguous ops unchanged.
set -u
source scripts/gpu_call.sh pad26
padded_tests pad26
decode_bench_ws1 pad25 a
decode_bench_ws1 pad26
decode_bench_ws1 pad25 b
for b in pad25:c pad26: pad25:d; do
  build=${b%%:*} tag=${b#*:}
  use_build "$build"
  step "decode bench ws1 warm $build$tag" "bench_warm_$build$tag.log" 60 env ${N}_SELF_SEND=1 python3 -m moe_backend.cli \
    bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 --warm-inputs \
    --out "$raw/decode_ws1_warm_$build$tag.json"
  grep -E "^nvshmem" "$raw/bench_warm_$build$tag.log"
done
