#!/bin/bash
# Session 65, one GPU; carry `.commit .devso/pad45.so.gz` (main's kernels).
# The warm penalty's kernels over many rounds. Run 57: the whole dispatch pays after a fill kernel or
# a reduction before the sleep, the whole combine after the reduction only (+0.5-1.0 us, medians of
# 100 calls), yet one profiled round showed their kernels starting and lasting within 0.3 us of cold.
# `--rounds 100` gives each activity's median start (from the barrier's end) and length over 100
# rounds, cold, launch, launch-out and fill (SELF_SEND=1). Reading: a median start or length as much
# later or longer as the bench's penalty -> the kernels pay it (start: the launch path; length:
# inside the kernel); both within 0.1 us of cold -> the CUDA-event measure around the op holds it,
# not the op's kernels. Then the decode bench cold, launch, `--warm-by launch-out` (launch's reductions into
# an output made once: nothing from the caching allocator) and fill: launch-out as cold for the
# combine -> the reduction's allocation costs the combine; as launch -> the reduction's kernel.
set -u
source scripts/gpu_call.sh pad45
for mode in cold launch launch-out fill; do
  flag=$(case $mode in cold) ;; *) echo --warm-by=$mode ;; esac)
  step "timeline $mode" "timeline_$mode.log" 150 env ${N}_SELF_SEND=1 python3 scripts/profile_timeline.py \
    "$raw/timeline_$mode" decode --world-size 1 --whole --rounds 100 $flag
done
decode_bench_ws1 pad45 _cold --num-tokens 1 8 32
for mode in launch launch-out fill; do
  decode_bench_ws1 pad45 _$mode --num-tokens 1 8 32 --warm-by=$mode
done
