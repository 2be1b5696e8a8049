#!/bin/bash
# Session 52 (prepared, not run), one GPU; carry `.commit .devso/padstamps13.so.gz
# .devso/main53.so.gz .devso/pad13.so.gz`. Builds: `padstamps13` and `main53` from main at 43e8c44
# (main's kernels, round 69's rule; the stamps build with MOE_BACKEND_STAMPS=1 and two more padded
# stamps: the empty experts' counts stored, a row slice's copy issued); `pad13` from branch
# `round70` (dc2cd39: the padded dispatch's per-expert counter at GPU scope for experts on this GPU).
# 1. Where a 1-token padded dispatch's rows phase goes (run 48 calls 3-4: 4.6 of the kernel's
#    6.3 us, as long with one pass of loads a warp as with seven): masks -> empty counts -> copies
#    issued -> rows done (slot words, counter, the count's release) -> counts seen.
# 2. The one-GPU padded tests on main53 (main's, not yet run: bit_rank reused) and on pad13;
#    round 70: then the decode bench (SELF_SEND=1) main53, pad13,
#    main53. Predicted: pad13 at or below main53 at 32 and 128 tokens (experts of several rows take
#    the counter; at world size 1 all are on this GPU); equal at 1 token (no slices, no counter).
set -u
source scripts/gpu_call.sh padstamps13
for v in 1 0; do
  step "padded timeline partials=$v" timeline_padded$v.log 120 env ${N}_PADDED_PARTIALS=$v \
    python3 scripts/kernel_timeline.py --config deepseek_decode --tokens 1 32 128 --iters 100 --world-size 1 --padded \
    --out "$raw/timeline_padded$v.json"
  grep -E "tokens per rank|dispatch" "$raw/timeline_padded$v.log" | head -30
done
use_build main53
step "padded one GPU main53" tests_padded_single_main53.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
use_build pad13
step "padded one GPU pad13" tests_padded_single.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
decode_bench_ws1 main53 a
decode_bench_ws1 pad13
decode_bench_ws1 main53 b
