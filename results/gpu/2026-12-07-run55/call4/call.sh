#!/bin/bash
# Session 62, one GPU (an H200 came); carry `.commit .devso/pad45.so.gz .devso/pad41.so.gz .devso/pad42.so.gz`.
# Rounds 87-88 cold (run 53 call 3 measured them only with the inputs warm, the default-warm bug;
# the patch: results/gpu/2026-12-06-run53/call3/rounds87-88.patch): `pad41` = round 87, `pad42` =
# rounds 87 + 88, main (`pad45`) before and after, the decode bench at 1 / 8 / 32 / 128 tokens.
set -u
source scripts/gpu_call.sh pad45
decode_ab_ws1 "pad45:_1 pad41:_2 pad42:_3 pad45:_4" --num-tokens 1 8 32 128
pack
