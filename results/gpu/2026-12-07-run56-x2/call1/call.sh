#!/bin/bash
# Session 62 (prepared), TWO GPUs; carry `.commit .devso/pad46.so.gz .devso/pad47.so.gz .devso/pad45.so.gz`.
# Rounds 90-91 at EP2 (see results/gpu/2026-12-07-run56/call1, which holds their patches): there S
# went from 8 (112 chunks a slice: four passes a lane, two bulk sub-slices) to 28, and round 91 sends
# a one-pass slice by the register path. The padded tests on two GPUs with each, then DeepSeek decode
# at EP2 by issue 6's method (200 iterations), main's build and the two rounds': predicted
# combine_padded 1.5-2 us less at 1-8 tokens (90), another 0.2-0.5 (91), under the contiguous
# combine's 10.6 at 1.
set -u
source scripts/gpu_call.sh pad46
for b in pad46 pad47; do
  use_build $b
  step "padded EP2 $b" tests_padded_$b.log 200 python3 -m pytest -q -m gpu -rA -x tests/gpu/test_nvshmem.py -k padded
done
for b in pad45 pad46 pad47; do
  use_build $b
  step "decode bench EP2 $b" bench_decode_$b.log 150 python3 -m moe_backend.cli bench --config deepseek_decode \
    --backend nvshmem --num-tokens 1 8 32 128 --out "$raw/decode_$b.json"
  grep -E "^nvshmem" "$raw/bench_decode_$b.log"
done
