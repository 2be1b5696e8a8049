#!/bin/bash
# Session 51, one GPU, build `pad6` (pad5 with round 66's partials send fixed: its chunk loop's
# shuffles taken by every lane (full-mask shuffles in a loop some lanes had left: wrong sums where
# a partial has fewer than 32 chunks a lane, run 46 call 7), and cut into slices a warp each (one
# warp a token's partial: 39 us at 1 token)); carry `.commit .devso/pad6.so.gz`.
# 1. The padded tests with and without PADDED_PARTIALS (world size 1; EP2 on the shared GPU).
# 2. The decode bench at world size 1, SELF_SEND=1, by default and with PADDED_PARTIALS=1.
#    Predicted: combine_padded 12.8 -> ~8 us at 1 token, 27.1 -> ~15 at 128 tokens.
set -u
source scripts/gpu_call.sh pad6
step "padded one GPU" tests_padded_single.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
step "padded shared EP2" tests_padded_shared.log 200 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 MOE_TEST_CASES=8 \
  python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k padded
for v in 0 1; do
  step "decode bench ws1 partials=$v" bench_partials$v.log 100 env MOE_BACKEND_NVSHMEM_SELF_SEND=1 \
    MOE_BACKEND_NVSHMEM_PADDED_PARTIALS=$v python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem \
    --world-size 1 --iters 100 --out "$raw/decode_ws1_partials$v.json"
  grep -E "^nvshmem" "$raw/bench_partials$v.log"
done
