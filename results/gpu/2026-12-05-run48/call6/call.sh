#!/bin/bash
# Session 52 (prepared, not run), one GPU, build `padstamps12` (main's kernels, round 69's rule,
# with MOE_BACKEND_STAMPS=1 and two more padded stamps: the empty experts' counts stored, a row
# slice's copy issued); carry `.commit .devso/padstamps12.so.gz`.
# Where a 1-token padded dispatch's rows phase goes (run 48 calls 3-4: 4.6 of the kernel's 6.3 us,
# as long with one pass of loads a warp as with seven): masks -> empty counts -> copies issued ->
# rows done (slot words, the count's release) -> counts seen. Partials (default) and not; the
# contiguous cross-rank path beside it.
set -u
source scripts/gpu_call.sh padstamps12
for v in 1 0; do
  step "padded timeline partials=$v" timeline_padded$v.log 120 env ${N}_PADDED_PARTIALS=$v \
    python3 scripts/kernel_timeline.py --config deepseek_decode --tokens 1 32 128 --iters 100 --world-size 1 --padded \
    --out "$raw/timeline_padded$v.json"
  grep -E "tokens per rank|dispatch" "$raw/timeline_padded$v.log" | head -30
done
