#!/bin/bash
# Session 61: run as run 54 call 1 (prepared in session 59 as run 53 call 6, moved here).
# Session 59 (prepared), one GPU; carry `.commit .devso/pad39.so.gz .devso/pad32.so.gz` (main's
# kernels after round 86; main's before it: build both from their commits, 32bdf45 and 9d47826).
# Round 86 cold: calls 1 and 3 timed it with the inputs warm by read (the bench's default-warm bug,
# 9d47826 to 661b8c4). The decode bench, now cold, at 1 / 8 / 16 / 32 / 128 tokens, pad32 before and
# after pad39. Predicted: dispatch_padded 2+ us less at 8 and 16 tokens as warm (call 7 had the
# 8-token call slow cold as well: 8.4-8.6 us), within 0.2 at 128; the other ops unchanged.
set -u
source scripts/gpu_call.sh pad39
decode_ab_ws1 "pad32:a pad39: pad32:b" --num-tokens 1 8 16 32 128
