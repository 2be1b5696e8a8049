#!/bin/bash
# Session 59, one GPU; carry `.commit .devso/padstamps39.so.gz` (main's kernels after round 86,
# with stamps: `scripts/build_device_extension.sh padstamps39 MOE_BACKEND_STAMPS=1`).
# Where round 86's padded dispatch spends its 6.0-6.3 us (1 / 8 / 32 tokens): the padded timeline
# cold, then warm by write (x rewritten in place after the barrier, dirty in L2 as the kernel that
# made it leaves it). Round 73 read the 1-token row's loads as one ~2-2.5 us latency on a cold x;
# round 72's stamps (pad15, 1 token): masks 0.8, copied 3.1, rows 4.0, counts 4.7, exit 5.2 us.
set -u
source scripts/gpu_call.sh padstamps39
for mode in cold write; do
  flag=$([ $mode = write ] && echo --warm-by=write)
  step "padded timeline $mode" timeline_padded_$mode.log 120 python3 scripts/kernel_timeline.py \
    --config deepseek_decode --tokens 1 8 32 --iters 100 --world-size 1 --padded $flag \
    --out "$raw/timeline_padded_$mode.json"
  grep -vE "^\[|Warning|warn|^ *return" "$raw/timeline_padded_$mode.log" | head -60
done
