#!/bin/bash
# Session 54 (prepared, not run), one GPU; carry `.commit .devso/pad22.so.gz .devso/pad23.so.gz
# .devso/pad24.so.gz .devso/pad18.so.gz`.
# Builds: `pad22` from branch `round78` (round 78: the padded dispatch's round by a ticket taken
# after the masks, advanced by the last ticket's block at its end: no barrier or atomic round trip
# at any block's end); `pad23` from branch `round79` (round 78 and the receive from the grid's last
# threads: a small call's count waits overlap its rows); `pad24` from branch `round80` (the partials
# combine's receive items on the grid's last warps: a small call's waits beside its sends); `pad18`
# main's kernels.
# 1. The padded tests on pad23 and pad24 (world size 1; EP2 with both ranks on the GPU: rounds,
#    split phases and CUDA-graph replays advance the round).
# 2. The decode bench (SELF_SEND=1) pad18, pad22, pad23, pad24, pad18. Predicted: dispatch_padded
#    0.3-0.5 us less on pad22 at every size (the stamps' counts -> exit: 0.5-0.6 us); pad23 another
#    ~0.8 at 1 token (the counts' polls, ~0.9 us after the rows, then beside them), less at 32, none
#    at 128; pad24's combine_padded ~0.5 us less at 1 and 32 tokens (sent -> exit: ~1.0 us), the
#    same at 128.
set -u
source scripts/gpu_call.sh pad23
padded_tests pad23
use_build pad24
padded_tests pad24
decode_bench_ws1 pad18 a
decode_bench_ws1 pad22
decode_bench_ws1 pad23
decode_bench_ws1 pad24
decode_bench_ws1 pad18 b
