#!/bin/bash
# Session 59, one GPU; carry `.commit .devso/pad39.so.gz .devso/pad40.so.gz .devso/pad32.so.gz`.
# Round 86 (branch `round86`): run 52 call 8 found round 85 (row items round the blocks) changed
# nothing at 8 tokens (8.4 us) because the grid itself was 4 blocks (NWARPS items a block). Here
# the padded dispatch launches a block a row item up to the SMs: `pad39` for every call, `pad40`
# for unsliced calls only (rows < SMs; sliced calls keep NWARPS-item blocks). Both on round 85.
# The padded tests on pad39, then the decode bench at 1 / 8 / 16 / 32 / 128 tokens beside pad32.
# Predicted: dispatch_padded at 8 and 16 tokens ~7.0 us (from 8.4-8.7), 1 token 0.5-1.5 less if
# the rows phase (4.6 us of 6.3 in run 48) is one SM's load and store rate; 32 tokens (64 blocks
# before) lower on pad39 only.
set -u
source scripts/gpu_call.sh pad39
padded_tests pad39
decode_ab_ws1 "pad32:a pad39: pad40: pad32:b" --num-tokens 1 8 16 32 128
