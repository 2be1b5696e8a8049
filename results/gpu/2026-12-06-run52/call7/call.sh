#!/bin/bash
# Session 58, one GPU; carry `.commit .devso/pad32.so.gz` (main's kernels).
# The small contiguous calls' warm penalty (run 51 calls 3 and 7: the 1-token combine ~1.6 us slower
# with --warm-inputs, its receive kernel +1.0 us; the padded ops none, though their dispatch reads
# the same inputs). Is it the reading reduction (amax over every input, run before the sleep) that
# the warm path adds, or the inputs being in L2? `--warm-by write` touches them by an in-place
# elementwise rewrite instead. And does the SMs' shared-memory configuration play a part (every
# kernel at the largest carveout: MOE_BACKEND_NVSHMEM_CARVEOUT=1)?
# The decode bench (SELF_SEND=1), 128-token arena, 1 / 8 / 32 tokens: cold, warm by read, warm by
# write, warm by read with CARVEOUT=1, cold again.
set -u
source scripts/gpu_call.sh pad32
for run in cold:: read:--warm-inputs: write:--warm-by=write: readcarve:--warm-inputs:1 cold2::; do
  IFS=: read -r tag flag carve <<< "$run"
  step "decode bench $tag" "bench_$tag.log" 60 env ${N}_SELF_SEND=1 ${carve:+${N}_CARVEOUT=$carve} \
    python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 \
    --num-tokens 1 8 32 $flag --out "$raw/decode_$tag.json"
  grep -E "^nvshmem|^==" "$raw/bench_$tag.log"
done
