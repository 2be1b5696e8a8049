#!/bin/bash
# Session 51, one GPU, build `pad8` (pad7 with the partials' send sized over its whole item space,
# every (source group, token < M) a warp each where the GPU has them: call 3's 1-token row, 10.5 us,
# had each warp skip 13 empty tokens one after another); carry `.commit .devso/pad8.so.gz`.
# 1. The one-GPU padded tests with and without PADDED_PARTIALS.
# 2. The decode bench at world size 1, SELF_SEND=1, by default and with PADDED_PARTIALS=1.
#    Predicted with partials: ~8 / ~8.3 / ~16.5 us at 1 / 32 / 128 tokens.
set -u
source scripts/gpu_call.sh pad8
step "padded one GPU" tests_padded_single.log 120 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
for v in 0 1; do
  step "decode bench ws1 partials=$v" bench_partials$v.log 60 env MOE_BACKEND_NVSHMEM_SELF_SEND=1 \
    MOE_BACKEND_NVSHMEM_PADDED_PARTIALS=$v python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem \
    --world-size 1 --iters 100 --out "$raw/decode_ws1_partials$v.json"
  grep -E "^nvshmem" "$raw/bench_partials$v.log"
done
