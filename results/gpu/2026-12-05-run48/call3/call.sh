#!/bin/bash
# Session 52, one GPU, build `padstamps9` (pad9 with MOE_BACKEND_STAMPS=1: `scripts/build_device_extension.sh padstamps9 MOE_BACKEND_STAMPS=1`); carry
# `.commit .devso/padstamps9.so.gz`. Where the padded kernels' time goes (round 65's open
# question: 10 us of one block at 1 token): their stamps at world size 1, by default and with
# PADDED_PARTIALS=0 (partials the default since round 67), beside the contiguous ops' cross-rank path (SELF_SEND=1).
set -u
source scripts/gpu_call.sh padstamps9
for v in 0 1; do
  step "padded timeline partials=$v" timeline_padded$v.log 120 env MOE_BACKEND_NVSHMEM_PADDED_PARTIALS=$v \
    python3 scripts/kernel_timeline.py --config deepseek_decode --tokens 1 32 128 --iters 100 --world-size 1 --padded \
    --out "$raw/timeline_padded$v.json"
  grep -A14 "1 tokens per rank" "$raw/timeline_padded$v.log" | head -16
done
step "contiguous timeline self-send" timeline_self_send.log 120 env MOE_BACKEND_NVSHMEM_SELF_SEND=1 \
  python3 scripts/kernel_timeline.py --config deepseek_decode --tokens 1 32 128 --iters 100 --world-size 1 \
  --out "$raw/timeline_self_send.json"
