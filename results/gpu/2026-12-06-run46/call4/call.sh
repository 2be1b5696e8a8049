#!/bin/bash
# Session 50 (call 4, right after call 3 on the same warm H100), build `pad3`; carry `.commit .devso/pad3.so.gz`.
# The decode bench at world size 1 with SELF_SEND=1: the contiguous ops through the cross-rank path
# (slots and flags, as another rank's tokens), the fair world-size-1 baseline for the padded ops,
# which always take their cross-rank path.
source scripts/gpu_call.sh pad3 >/dev/null 2>&1; step "decode bench ws1 self-send" bench_self_send.log 120 env MOE_BACKEND_NVSHMEM_SELF_SEND=1 python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 --out "$raw/decode_ws1_self_send.json"; grep -E "^nvshmem" "$raw/bench_self_send.log"
