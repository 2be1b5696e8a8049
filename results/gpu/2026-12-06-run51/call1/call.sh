#!/bin/bash
# Session 55 (prepared), one GPU; carry `.commit .devso/pad25.so.gz .devso/pad23.so.gz`.
# Builds: `pad25` from branch `round81` (round 81: the partials combine's receive on the grid's last
# warps only where the call's live sends and receive items fit the grid together); `pad23` main's
# kernels (rounds 78-79 merged).
# 1. The padded tests on pad25 (world size 1; EP2 with both ranks on the GPU).
# 2. The decode bench (SELF_SEND=1) pad23, pad25, pad23. Predicted: combine_padded ~7.3 / ~7.9 us at
#    1 / 32 tokens (round 80's), main's 16.4-16.5 at 128; dispatch_padded unchanged.
set -u
source scripts/gpu_call.sh pad25
padded_tests pad25
decode_bench_ws1 pad23 a
decode_bench_ws1 pad25
decode_bench_ws1 pad23 b
