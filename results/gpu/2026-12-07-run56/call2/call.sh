#!/bin/bash
# Session 62 (prepared), one GPU; carry `.commit .devso/pad45.so.gz` (main's kernels).
# The warm penalty's second control. Run 55 call 2: `--warm-by scratch` (the touching reads on a
# scratch buffer of each input's size, the inputs cold) is as slow as warm, so the touching kernels
# cost the small whole contiguous ops their ~1 us, not the inputs' warmth. `--warm-by launch` runs
# the same reads on 16 bytes each: as cold -> the memory the reads sweep costs it (what it evicts or
# the translations it refills); as scratch -> the kernels themselves do.
# The decode bench (SELF_SEND=1) at 1 / 8 / 32 tokens: cold, scratch, launch, cold again.
set -u
source scripts/gpu_call.sh pad45
for mode in cold scratch launch cold2; do
  flag=$(case $mode in scratch|launch) echo --warm-by=$mode ;; esac)
  step "decode bench $mode" "bench_$mode.log" 60 env ${N}_SELF_SEND=1 python3 -m moe_backend.cli bench \
    --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 --num-tokens 1 8 32 $flag \
    --out "$raw/decode_$mode.json"
  grep -E "^nvshmem" "$raw/bench_$mode.log"
done
