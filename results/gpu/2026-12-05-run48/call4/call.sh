#!/bin/bash
# Session 52, one GPU, build `pad10` (round 69: the padded dispatch cuts each row into slices, a
# warp each, until the call fills the SMs; call 3's stamps: a warp a row took 4.6 us of the 1-token
# dispatch's 6.3), `pad9` beside it as the same machine's baseline, `padstamps10` for the stamps;
# carry `.commit .devso/pad10.so.gz .devso/pad9.so.gz .devso/padstamps10.so.gz`.
# 1. The one-GPU padded tests, with and without partials (pad10).
# 2. The decode bench at world size 1 (SELF_SEND=1): pad10 and pad9, partials (the default).
#    Predicted: pad10's padded dispatch ~3 us below pad9's at 1 token (10.0 -> ~7), ~2 at 32.
# 3. The padded timeline (padstamps10).
set -u
source scripts/gpu_call.sh pad10
step "padded one GPU" tests_padded_single.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
bench() {  # BUILD
  MOE_BACKEND_DEVSO=$1 source scripts/gpu_devso.sh
  step "decode bench ws1 $1" bench_$1.log 60 env ${N}_SELF_SEND=1 \
    python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 \
    --out "$raw/decode_ws1_$1.json"
  grep -E "^nvshmem" "$raw/bench_$1.log"
}
bench pad10
bench pad9
MOE_BACKEND_DEVSO=padstamps10 source scripts/gpu_devso.sh
step "padded timeline" timeline_padded.log 120 python3 scripts/kernel_timeline.py --config deepseek_decode \
  --tokens 1 32 128 --iters 100 --world-size 1 --padded --out "$raw/timeline_padded.json"
grep -E "tokens per rank|dispatch" "$raw/timeline_padded.log" | head -30
