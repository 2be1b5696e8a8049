#!/bin/bash
# Session 54 (prepared, not run: the session's device time was spent), one GPU; carry
# `.commit .devso/pad21.so.gz .devso/pad18.so.gz`.
# Builds: `pad21` from branch `round77` (round 77's third form: the grouped one-pass send loop only
# where the call is small, main's loop of an item a warp otherwise); `pad18` main's kernels.
# 1. The padded tests on pad21 (world size 1: the grouped loop; EP2 with both ranks on the GPU: the
#    DeepSeek-like case of 64 tokens takes main's loop).
# 2. The decode bench (SELF_SEND=1) pad18, pad21, pad18. Predicted: combine_padded ~0.3-0.5 us less
#    at 1 and 32 tokens (run 50 call 3's pad20), within 0.3 of pad18 at 128.
set -u
source scripts/gpu_call.sh pad21
padded_tests pad21
decode_bench_ws1 pad18 a
decode_bench_ws1 pad21
decode_bench_ws1 pad18 b
