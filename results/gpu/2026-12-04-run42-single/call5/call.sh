#!/bin/bash
# Run 42, call 5 (one H200): split warps in the decode kernels of main after round 57 (`gcall`):
# `ncu` source counters of one launch each of the fused dispatch, the combine send and the
# combine receive at 1 and 128 tokens (DeepSeek decode, world size 1), then
# scripts/ncu_groups.py --split --runs on each export.
set -u
raw=$OUT/raw; mkdir -p $raw /tmp/w
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=gcall MOE_BACKEND_COMMIT=$(cat .commit) MOE_BACKEND_NVSHMEM_BOOTSTRAP=native
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
for n in 1 128; do
  for k in dispatch_fused_kernel combine_send_kernel combine_recv_kernel; do
    timeout 60 ncu --section SourceCounters --section WarpStateStats --section LaunchStats -k regex:$k --launch-skip 10 \
      --launch-count 1 --clock-control none -o /tmp/w/${k}_$n \
      python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --num-tokens $n \
      --iters 5 --warmup 10 > $raw/ncu_${k}_$n.log 2>&1
    echo "ncu $k $n rc $? at $(( $(date +%s) - T0 )) s"
    ncu -i /tmp/w/${k}_$n.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $raw/${k}_${n}_sass.csv.gz
    python3 scripts/ncu_groups.py $raw/${k}_${n}_sass.csv.gz --split --runs --top 8 > $raw/groups_${k}_$n.txt 2>&1
    grep -A4 "^split warps" $raw/groups_${k}_$n.txt
  done
done
tar czf $OUT/call.tgz -C $raw .
