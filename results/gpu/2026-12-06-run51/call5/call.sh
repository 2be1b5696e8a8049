#!/bin/bash
# Session 56, one GPU; carry `.commit .devso/pad25.so.gz .devso/pad27.so.gz`.
# Builds: `pad27` from branch `round83` (round 83: the partials combine's send takes a slice's rows
# by bulk copies into a per-warp buffer, 8 rows x 64 chunks, one load latency a slice where the
# register path takes two); `pad25` main's kernels (rounds 78-79, 81).
# 1. The padded tests on pad27 (world size 1; EP2 with both ranks on the GPU): random cases, topk
#    <= 8 with equal out / transfer dtypes by the bulk path, the others by registers.
# 2. The decode bench (SELF_SEND=1) cold: pad25, pad27, pad25; then warm (`--warm-inputs`, the
#    filled rows touched in place): pad25, pad27, pad25. Predicted: combine_padded 0.5-1.5 us less at
#    128 tokens (warm and cold), 0.2-0.4 less at 1 and 32; dispatch_padded and the contiguous ops
#    unchanged.
set -u
source scripts/gpu_call.sh pad27
padded_tests pad27
# A hang or failure of the new path: no bench of it (each would wait out its limit).
grep -q "2 passed" "$raw/tests_padded_single_pad27.log" || { echo "pad27 tests failed: no bench"; exit 0; }
decode_bench_ws1 pad25 a
decode_bench_ws1 pad27
decode_bench_ws1 pad25 b
for b in pad25:c pad27: pad25:d; do
  build=${b%%:*} tag=${b#*:}
  use_build "$build"
  step "decode bench ws1 warm $build$tag" "bench_warm_$build$tag.log" 60 env ${N}_SELF_SEND=1 python3 -m moe_backend.cli \
    bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 --warm-inputs \
    --out "$raw/decode_ws1_warm_$build$tag.json"
  grep -E "^nvshmem" "$raw/bench_warm_$build$tag.log"
done
