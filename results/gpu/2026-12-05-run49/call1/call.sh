#!/bin/bash
# Session 53, one GPU; carry `.commit .devso/padstamps14.so.gz .devso/pad14.so.gz .devso/pad13.so.gz`.
# Builds: `pad14` / `padstamps14` from branch `round71` (round 71: the padded dispatch's small rows
# in one load latency: warp_copy_wide, the slot's small words loaded with the row, the empty
# experts' counts after the rows from the grid's last threads); `pad13`: main's kernels (round 70).
# 1. The padded dispatch's stamps at 1 / 32 / 128 tokens (run 48 call 6 at 1 token: masks 0.7,
#    copied 3.7, rows 5.8, exit 6.8 us). Predicted: copied ~1.5, rows ~2.5-3, exit ~4.
# 2. The padded tests on pad14: world size 1, and EP2 with both ranks on the GPU.
# 3. The decode bench (SELF_SEND=1) pad13, pad14, pad13. Predicted: dispatch_padded ~8 us at 1
#    token (pad13: 10.1), ~0.3 less at 32 and 128.
set -u
source scripts/gpu_call.sh padstamps14
step "padded timeline" timeline_padded.log 120 python3 scripts/kernel_timeline.py --config deepseek_decode \
  --tokens 1 32 128 --iters 100 --world-size 1 --padded --out "$raw/timeline_padded.json"
grep -E "tokens per rank|dispatch" "$raw/timeline_padded.log" | head -30
use_build pad14
step "padded one GPU pad14" tests_padded_single.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
step "padded shared EP2 pad14" tests_padded_shared.log 200 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 MOE_TEST_CASES=8 \
  python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k padded
decode_bench_ws1 pad13 a
decode_bench_ws1 pad14
decode_bench_ws1 pad13 b
