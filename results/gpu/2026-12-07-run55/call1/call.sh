#!/bin/bash
# Session 61 (prepared), one GPU; carry `.commit .devso/pad45.so.gz` (main's kernels: `pad39`'s SASS
# but for one instruction's place and two registers, after 7ac4fac's helpers).
# Where the 1-token padded kernels' time goes, by instruction (rounds 87-89 moved their loads and
# gained nothing; run 54 call 3's stamps: the combine's send 5.4 of its 6.8 us). Run 46 call 6's
# ncu took one launch at the default sampling interval: 7 and 44 stall samples. Here: the stall
# sampling every 32 cycles (`--warp-sampling-interval 0`), 20 launches of each kernel, caches and clocks
# left as they are; the source page (SASS, samples per reason and instruction) of every launch as CSV, summed by
# `scripts/ncu_groups.py --launches` (stall_no_inst against stall_long_sb: code against loads).
# Session 62: BUILD (default pad45, as run) profiles another carried build (1am's pad46 after it).
set -u
source scripts/gpu_call.sh ${BUILD:-pad45}
for k in pad_dispatch_kernel pad_combine_partials_kernel; do
  step "ncu $k" ncu_$k.log 200 ncu --section SourceCounters --section WarpStateStats --warp-sampling-interval 0 \
    --import-source yes --cache-control none --clock-control none -k regex:$k --launch-skip 4 --launch-count 20 \
    -o "$raw/$k" python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 \
    --num-tokens 1 --warmup 4 --iters 24
  ncu --import "$raw/$k.ncu-rep" --page details > "$raw/${k}_details.txt" 2>&1
  ncu --import "$raw/$k.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip > "$raw/${k}_sass.csv.gz"
  rm -f "$raw/$k.ncu-rep"
  grep -E "Duration|Warp Cycles Per Issued" "$raw/${k}_details.txt" | head -4
  python3 scripts/ncu_groups.py "$raw/${k}_sass.csv.gz" --launches --runs --top 25 > "$raw/${k}_groups.txt" 2>&1
  sed -n '/stall reasons/,/barrier waits\|code run/p' "$raw/${k}_groups.txt" | head -40
done
pack
