#!/bin/bash
# Session 61: run as run 54 call 2, cold this time (run 52 call 9 ran both sides warm: the default-warm bug).
# Session 58 (prepared), one GPU; carry `.commit .devso/pad32.so.gz` (main's kernels).
# The small whole contiguous ops' warm penalty (call 7: combine +1.0-1.7 us, dispatch +0.5-1.0,
# whether the inputs are read or rewritten, at any carveout; the padded ops none). Which launch
# form carries it? At 1-32 tokens in the 128-token arena the whole combine's receive runs on the
# side stream (fork and join by events), the whole dispatch is one fused kernel. The decode bench
# (SELF_SEND=1) cold and warm by write for: the defaults; every whole combine's receive by PDL on
# the caller's stream (WHOLE_COMBINE=1); no concurrent receive at all (COMBINE_OVERLAP=0: the
# receive after the send, stream-ordered); the dispatch in two kernels (FUSED_DISPATCH=0).
# Reading: a form whose warm and cold agree does not carry the penalty.
set -u
source scripts/gpu_call.sh pad32
for form in base: pdl:WHOLE_COMBINE=1 seq:COMBINE_OVERLAP=0 twodisp:FUSED_DISPATCH=0; do
  IFS=: read -r tag switch <<< "$form"
  for mode in cold write; do
    flag=$([ $mode = write ] && echo --warm-by=write)
    step "decode bench $tag $mode" "bench_${tag}_$mode.log" 60 env ${N}_SELF_SEND=1 ${switch:+${N}_$switch} \
      python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 \
      --num-tokens 1 8 32 $flag --out "$raw/decode_${tag}_$mode.json"
    grep -E "^nvshmem" "$raw/bench_${tag}_$mode.log"
  done
done
