#!/bin/bash
# Session 52 (prepared, not run), one GPU; carry `.commit .devso/padstamps12.so.gz
# .devso/main52.so.gz .devso/pad12.so.gz`. Builds: `padstamps12` and `main52` from main at dca45f9
# (main's kernels, round 69's rule; the stamps build with MOE_BACKEND_STAMPS=1 and two more padded
# stamps: the empty experts' counts stored, a row slice's copy issued); `pad12` from branch
# `round70` (cecb8f0: the padded dispatch's per-expert counter at GPU scope for experts on this GPU).
# 1. Where a 1-token padded dispatch's rows phase goes (run 48 calls 3-4: 4.6 of the kernel's
#    6.3 us, as long with one pass of loads a warp as with seven): masks -> empty counts -> copies
#    issued -> rows done (slot words, counter, the count's release) -> counts seen.
# 2. Round 70: the one-GPU padded tests on pad12, then the decode bench (SELF_SEND=1) main52, pad12,
#    main52. Predicted: pad12 at or below main52 at 32 and 128 tokens (experts of several rows take
#    the counter; at world size 1 all are on this GPU); equal at 1 token (no slices, no counter).
set -u
source scripts/gpu_call.sh padstamps12
for v in 1 0; do
  step "padded timeline partials=$v" timeline_padded$v.log 120 env ${N}_PADDED_PARTIALS=$v \
    python3 scripts/kernel_timeline.py --config deepseek_decode --tokens 1 32 128 --iters 100 --world-size 1 --padded \
    --out "$raw/timeline_padded$v.json"
  grep -E "tokens per rank|dispatch" "$raw/timeline_padded$v.log" | head -30
done
use_build pad12
step "padded one GPU pad12" tests_padded_single.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
decode_bench_ws1 main52 a
decode_bench_ws1 pad12
decode_bench_ws1 main52 b
