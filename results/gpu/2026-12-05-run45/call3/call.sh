#!/bin/bash
# Session 48, one GPU (two not lent), build `stamps47` (main46's kernels with the timeline stamps,
# MOE_BACKEND_STAMPS=1); carry `.commit .devso`. The world-size-1 part of run 44's call 8 (which
# call 1 could not run: a step's MOE_BACKEND_DEVSO does not swap the carried build): where the
# fused decode dispatch's ~4.2 us above the one-launch floor go at 1 token (7.0-7.2 against 2.8),
# and at 32 and 128 tokens. Medians over 200 iterations, the whole op by CUDA events beside them.
set -u
source scripts/gpu_call.sh stamps47
step "timeline ws1" timeline_ws1.log 150 python3 scripts/kernel_timeline.py --config deepseek_decode \
  --tokens 1 32 128 --iters 200 --out "$OUT/timeline_ws1.json" --world-size 1
grep -E "^==|events|_exit" "$raw/timeline_ws1.log" | head -60
step "timeline ws1 put" timeline_ws1_put.log 150 python3 scripts/kernel_timeline.py --config deepseek_decode \
  --tokens 1 32 128 --iters 200 --out "$OUT/timeline_ws1_put.json" --world-size 1 --transport put
grep -E "^==|events|_exit" "$raw/timeline_ws1_put.log" | head -60
