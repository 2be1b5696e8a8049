#!/bin/bash
# Session 62, one GPU (an H200 came); carry `.commit .devso/pad45.so.gz .devso/pad41.so.gz .devso/pad42.so.gz`.
# Rounds 87-88 cold (run 53 call 3 measured them only with the inputs warm, the default-warm bug;
# the patch: results/gpu/2026-12-06-run53/call3/rounds87-88.patch): `pad41` = round 87, `pad42` =
# rounds 87 + 88, main (`pad45`) before and after, the decode bench at 1 / 8 / 32 / 128 tokens.
set -u
source scripts/gpu_call.sh pad45
i=0
for b in pad45 pad41 pad42 pad45; do
  i=$((i + 1))
  decode_bench_ws1 $b _$i --num-tokens 1 8 32 128
done
pack
