#!/bin/bash
# Session 61, one GPU; carry `.commit .devso/pad39.so.gz .devso/pad43.so.gz .devso/pad44.so.gz`.
# Round 89 (branch `round89`): call 3's stamps put the 1-token padded combine's
# send at slot words in 1.6 us after the scan (one load after the round's, serial), rows in 2.8 after
# (the weights' load, then the bulk copies, serial). pad43: the first item's slot words loaded beside
# the round; pad44: also the weights' shuffles after the copies' issue (round 87 put them after the
# copies' wait). Predicted: combine_padded cold 0.7-1.0 us less at 1-32 tokens for pad43, another
# 0.5-0.8 for pad44; 128 tokens (register path) at most the first.
# The padded tests on pad44, then the decode bench cold at 1 / 8 / 32 / 128 tokens, warm by write.
set -u
source scripts/gpu_call.sh pad44
padded_tests pad44
decode_ab_ws1 "pad39:a pad43: pad44: pad39:b" --num-tokens 1 8 32 128
for b in pad39 pad44; do
  decode_bench_ws1 "$b" w --num-tokens 1 8 32 128 --warm-by=write
done
