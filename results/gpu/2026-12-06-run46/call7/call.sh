#!/bin/bash
# Session 50 (prepared), one GPU, build `pad5` (pad3 + the split padded dispatch + round 66: the padded combine's per-token
# partials in round-tagged words behind MOE_BACKEND_NVSHMEM_PADDED_PARTIALS=1, and self-rank count
# words and flags released at GPU scope); carry `.commit .devso/pad5.so.gz`.
# 1. The padded tests with and without PADDED_PARTIALS (world size 1; EP2 on the shared GPU).
# 2. The decode bench at world size 1, SELF_SEND=1 (the contiguous cross-rank path beside the
#    padded ops), by default and with PADDED_PARTIALS=1. Predicted: combine_padded 13.0 -> ~8 us at
#    1 token (the contiguous combine's 7.5), 27.4 -> ~15 at 128 tokens.
set -u
source scripts/gpu_call.sh pad5
step "padded one GPU" tests_padded_single.log 200 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
step "padded shared EP2" tests_padded_shared.log 240 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 MOE_TEST_CASES=8 \
  python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k padded
for v in 0 1; do
  step "decode bench ws1 partials=$v" bench_partials$v.log 100 env MOE_BACKEND_NVSHMEM_SELF_SEND=1 \
    MOE_BACKEND_NVSHMEM_PADDED_PARTIALS=$v python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem \
    --world-size 1 --iters 100 --out "$raw/decode_ws1_partials$v.json"
  grep -E "^nvshmem" "$raw/bench_partials$v.log"
done
