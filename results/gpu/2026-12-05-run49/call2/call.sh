#!/bin/bash
# Session 53, one GPU; carry `.commit .devso/padstamps15.so.gz .devso/pad15.so.gz .devso/pad14.so.gz`.
# Builds: `pad15` / `padstamps15` from branch `round72` (round 72: in a whole padded dispatch this
# GPU's experts' counts go relaxed after the rows, their rows without counter or fence); `pad14`:
# main's kernels (round 71).
# 1. The padded dispatch's stamps at 1 / 32 / 128 tokens (run 49 call 1, padstamps14: copied 2.9 /
#    3.3 / 5.2, rows 4.9 / 6.7 / 11.3, exit 5.9 / 7.7 / 12.3 us). Predicted: rows ~0.1 after copied
#    at 1 token (exit ~4), most of the 3.4 and 6.1 us between them gone at 32 and 128.
# 2. The padded tests on pad15: world size 1, and EP2 with both ranks on the GPU (the split send
#    keeps the ordered path; the peer's experts theirs).
# 3. The decode bench (SELF_SEND=1) pad14, pad15, pad14. Predicted: dispatch_padded ~7 us at 1
#    token (pad14: 8.9), 1-3 us less at 32 and 128.
set -u
source scripts/gpu_call.sh padstamps15
step "padded timeline" timeline_padded.log 120 python3 scripts/kernel_timeline.py --config deepseek_decode \
  --tokens 1 32 128 --iters 100 --world-size 1 --padded --out "$raw/timeline_padded.json"
grep -E "tokens per rank|dispatch" "$raw/timeline_padded.log" | head -30
use_build pad15
step "padded one GPU pad15" tests_padded_single.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
step "padded shared EP2 pad15" tests_padded_shared.log 200 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 MOE_TEST_CASES=8 \
  python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k padded
decode_bench_ws1 pad14 a
decode_bench_ws1 pad15
decode_bench_ws1 pad14 b
