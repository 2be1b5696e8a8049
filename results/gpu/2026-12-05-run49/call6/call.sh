#!/bin/bash
# Session 53 (prepared, not run), one GPU; carry `.commit .devso/pad18.so.gz .devso/pad15.so.gz`.
# Builds: `pad18` from branch `round75` (round 75: less code on the padded dispatch's paths: the
# mask loops rolled, the attention-TP keep mask out of line, no unaligned fallbacks inline (the
# host refuses x / x_scale off a 16-byte boundary; the Communicator copies them first), scales of
# other sizes by 4-byte words; 2,920 -> 1,248 SASS instructions); `pad15`: main's kernels.
# 1. The padded tests on pad18 (world size 1; EP2 with both ranks on the GPU: the attention-TP
#    cases take pad_keep, the contract tasks the misaligned inputs).
# 2. The decode bench (SELF_SEND=1) pad15, pad18, pad15. Predicted: dispatch_padded 0.2-0.5 us less
#    at every size (fewer jumps over cold code on each warp's path, round 42's ~0.15-0.2 us each).
set -u
source scripts/gpu_call.sh pad18
padded_tests pad18
decode_bench_ws1 pad15 a
decode_bench_ws1 pad18
decode_bench_ws1 pad15 b
