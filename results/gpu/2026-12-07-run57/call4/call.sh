#!/bin/bash
# Session 64, one GPU; carry `.commit .devso/pad45.so.gz` (main's kernels).
# The warm penalty on a timeline: the small whole contiguous ops are ~1 us slower when any kernel
# runs before the barrier's sleep (runs 55-56: read, scratch, launch). torch.profiler's timeline of
# the whole dispatch and combine (DeepSeek decode, 1 and 128 tokens, world size 1, SELF_SEND=1)
# cold, warm by read, and the controls launch and fill: each activity's start after the barrier's
# sleep and its length. Reading: the op's first kernel starts later -> the launch path (host or
# front end); the same start, a longer kernel -> something inside the kernel (its first loads).
set -u
source scripts/gpu_call.sh pad45
for mode in cold read launch fill; do
  flag=$(case $mode in cold) ;; *) echo --warm-by=$mode ;; esac)
  step "timeline $mode" "timeline_$mode.log" 120 env ${N}_SELF_SEND=1 python3 scripts/profile_timeline.py \
    "$raw/timeline_$mode" decode --world-size 1 --whole $flag
done
# The small whole combine forks a side stream for its receive (event record and wait, a join after);
# the padded ops, which do not pay, are one launch. WHOLE_COMBINE=1 puts every whole combine's
# receive behind its send by PDL on the caller's stream (round 36: as fast cold): the decode bench
# cold and `--warm-by launch` with it. The penalty gone from the combine -> the fork and join pay it.
export ${N}_WHOLE_COMBINE=1  # for the steps after this line only
decode_bench_ws1 pad45 _pdl_cold --num-tokens 1 8 32
decode_bench_ws1 pad45 _pdl_launch --num-tokens 1 8 32 --warm-by=launch
