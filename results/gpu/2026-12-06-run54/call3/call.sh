#!/bin/bash
# Session 61: run as run 54 call 3 (prepared in session 59 as run 53 call 5, moved here).
# Session 59 (prepared), one GPU; carry `.commit .devso/padstamps43.so.gz` (main's kernels with
# stamps, built after the two stamps below were added: `scripts/build_device_extension.sh
# padstamps43 MOE_BACKEND_STAMPS=1`, gzip it; without stamps the kernels' SASS is pad39's).
# Where the 1-token padded combine's send goes (call 2: 4.4 us of its kernel's 5.9, scanned 1.1 ->
# sent 5.5; round 87's weight reorder moved nothing). New stamps on the live send items only:
# `pad_slots_in` (the token's slot words read and checked), `pad_rows_in` (the rows' bulk copies
# waited; calls of a few tokens: 128 tokens take the register path and do not stamp it). The
# padded timeline cold at 1 / 8 / 32 / 128 tokens, then warm by write.
set -u
source scripts/gpu_call.sh padstamps43
for mode in cold write; do
  flag=$([ $mode = write ] && echo --warm-by=write)
  step "padded timeline $mode" timeline_padded_$mode.log 150 python3 scripts/kernel_timeline.py \
    --config deepseek_decode --tokens 1 8 32 128 --iters 100 --world-size 1 --padded $flag \
    --out "$raw/timeline_padded_$mode.json"
  grep -vE "^\[|Warning|warn|^ *return" "$raw/timeline_padded_$mode.log" | head -80
done
