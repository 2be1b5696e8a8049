#!/bin/bash
# Session 52, one GPU, build `pad11` (round 69 with slices only for calls of at least a row per SM:
# call 4 on an H200 had pad10's slices 0.7 us faster at 32 tokens, 0.6 slower at 1), `pad10` and
# `pad9` beside it (pad9 first and last: the machine's drift); carry
# `.commit .devso/pad11.so.gz .devso/pad10.so.gz .devso/pad9.so.gz`.
# 1. The one-GPU padded tests (pad11).
# 2. The decode bench at world size 1 (SELF_SEND=1), partials: pad9, pad10, pad11, pad9.
#    Predicted: pad11 as pad9 at 1 token, as pad10 at 32 and 128.
set -u
source scripts/gpu_call.sh pad11
step "padded one GPU" tests_padded_single.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
bench() {  # BUILD TAG
  MOE_BACKEND_DEVSO=$1 source scripts/gpu_devso.sh
  step "decode bench ws1 $1 $2" bench_$1$2.log 60 env ${N}_SELF_SEND=1 \
    python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 \
    --out "$raw/decode_ws1_$1$2.json"
  grep -E "^nvshmem" "$raw/bench_$1$2.log"
}
bench pad9 a
bench pad10 ""
bench pad11 ""
bench pad9 b
