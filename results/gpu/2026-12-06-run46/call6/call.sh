#!/bin/bash
# Session 50 (call 6), one GPU, build `pad3`; carry `.commit .devso/pad3.so.gz`.
# Where the padded kernels' time goes at 1 token (world size 1, DeepSeek decode): ncu's full set on
# one launch of each (pad_dispatch_kernel, pad_combine_kernel), details page and SASS source CSV.
set -u
source scripts/gpu_call.sh pad3
for k in pad_dispatch pad_combine; do
  step "ncu $k" ncu_$k.log 100 ncu --set full --import-source yes -k regex:${k}_kernel --launch-skip 3 --launch-count 1 \
    --clock-control none -o "$raw/$k" python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem \
    --world-size 1 --num-tokens 1 --warmup 2 --iters 3
  ncu --import "$raw/$k.ncu-rep" --page details > "$raw/${k}_details.txt" 2>&1
  ncu --import "$raw/$k.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip > "$raw/${k}_sass.csv.gz"
  rm -f "$raw/$k.ncu-rep"
  grep -E "Duration|Elapsed Cycles|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Block Size|Grid Size" "$raw/${k}_details.txt" | head -10
done
pack
