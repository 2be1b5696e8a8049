#!/bin/bash
# Session 54, one GPU; carry `.commit .devso/pad20.so.gz .devso/pad18.so.gz`.
# Builds: `pad20` from branch `round77` (round 77: one-pass send slices for the partials combine
# where the live tokens fit the warps at a slice each, else the old slices); `pad18` main's kernels
# (round 75 merged).
# 1. The padded tests on pad20 (world size 1: one-pass slices; EP2 with both ranks on the GPU: the
#    DeepSeek-like case of 64 tokens takes the old slices).
# 2. The decode bench (SELF_SEND=1) pad18, pad20, pad18. Predicted: combine_padded ~0.5 us less at 1
#    and 32 tokens (run 50 call 2's pad19), the same at 128.
set -u
source scripts/gpu_call.sh pad20
padded_tests pad20
decode_bench_ws1 pad18 a
decode_bench_ws1 pad20
decode_bench_ws1 pad18 b
