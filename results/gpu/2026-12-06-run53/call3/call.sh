#!/bin/bash
# Session 59, one GPU; carry `.commit .devso/pad42.so.gz .devso/pad41.so.gz .devso/pad39.so.gz`.
# Branch `round87`: `pad41` = round 87 (the padded partials send takes the weights' shuffles after
# the rows' bulk copies are issued: in pad39's SASS the weight's load stalled the copies' issue),
# `pad42` = rounds 87 + 88 (the padded dispatch loads a row slice's first pass beside its experts'
# word, before the slot's lookup), `pad39` = main. Call 2's stamps at 1 token: the combine's send
# 4.4 us (scanned 1.1 -> sent 5.5), the dispatch's copy issued 1.1 us after the masks.
# The padded tests on pad42, then the decode bench at 1 / 8 / 32 / 128 tokens, main before and after.
# Predicted: combine_padded 0.4-0.7 us less at 1-32 tokens (one L2 latency off the send's chain;
# 128 tokens take the register path, unchanged); dispatch_padded a further 0.3-0.6 less at 1-32.
set -u
source scripts/gpu_call.sh pad42
padded_tests pad42
decode_ab_ws1 "pad39:a pad41: pad42: pad39:b" --num-tokens 1 8 32 128
