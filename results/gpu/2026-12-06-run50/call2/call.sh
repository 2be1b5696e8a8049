#!/bin/bash
# Session 54, one GPU; carry `.commit .devso/pad19.so.gz .devso/pad15.so.gz`.
# Builds: `pad19` from branch `round77` (round 77: the partials combine's send cut into one-pass
# slices, a warp's items found live by one load of their slot words); `pad15` main's kernels.
# 1. The padded tests on pad19 (world size 1 with and without partials; EP2 with both ranks on the
#    GPU: topk 1-8, so items a load of 32 / topk with lanes left over).
# 2. The decode bench (SELF_SEND=1) pad15, pad19, pad15. Predicted: combine_padded ~0.7 us less at
#    1 and 32 tokens (one pass of row loads, not two), the same at 128 (two live items a warp).
set -u
source scripts/gpu_call.sh pad19
padded_tests pad19
decode_bench_ws1 pad15 a
decode_bench_ws1 pad19
decode_bench_ws1 pad15 b
