#!/bin/bash
# Prepared in session 46 (no device lent) for `nvidia-h200-x2`: where the decode dispatch's time
# goes at EP2. Run 43's record has the whole dispatch 4.1 us above the one-launch floor at 1 token
# (11.9 against 7.8) and 8.4 at 128 (16.2); world size 1 has the same ~4.2 us at 1 token (7.0-7.2
# against 2.8). Which of the fused kernel's steps takes it at EP2 (the send's table, the wait for the
# peer's table, the scan, the rows' wait, the copy) decides the next round for issue 6's 1- and
# 128-token dispatch targets. Build: `scripts/build_device_extension.sh stamps47 MOE_BACKEND_STAMPS=1`
# from main (kernels as main46's, with the timeline stamps), gzip it; carry `.commit .devso`.
# Each timeline: medians over 200 iterations per rank, the whole op by CUDA events beside them.
set -u
# Session 59: main's stamps build is `padstamps43` (`scripts/build_device_extension.sh padstamps43
# MOE_BACKEND_STAMPS=1`, gzip it; carry `.commit .devso/padstamps43.so.gz`).
source scripts/gpu_call.sh padstamps43
tl() {  # NAME ARGS...: one timeline, its JSON under $OUT
  local name=$1
  shift
  step "timeline $name" "timeline_$name.log" 130 python3 scripts/kernel_timeline.py --config deepseek_decode \
    --tokens 1 32 128 --iters 200 --out "$OUT/timeline_$name.json" "$@"
  grep -E "^==|events|_exit" "$raw/timeline_$name.log" | head -60
}
tl ep2 --world-size 2
tl ep2_split --world-size 2 --split
tl ws1 --world-size 1
tl ep2_put --world-size 2 --transport put
# Session 54: the padded layout's kernels at EP2 (rounds 65-75; world size 1 only so far: run 50).
tl ep2_padded --world-size 2 --padded
# examples/decode_step.py (session 46) on the kernels: its step captured in a CUDA graph and replayed
# per batch, each checked against the dense computation.
step "decode example" decode_example.log 60 python3 examples/decode_step.py
tail -2 "$raw/decode_example.log"
