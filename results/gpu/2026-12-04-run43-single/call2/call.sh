#!/bin/bash
# Run 43, call 2 (one H200): split warps in round 59's combine kernels (`main43`, built from main:
# the by-call instances of the 128-token arena): `ncu` source counters of one launch each of the combine send and receive at 1 token
# (tagged by call) and 128 tokens (plain by call), DeepSeek decode, world size 1, then
# scripts/ncu_groups.py --split --runs on each export (round 57: a split warp runs the code after
# the split twice).
set -u
raw=$OUT/raw; mkdir -p $raw /tmp/w
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=main43 MOE_BACKEND_COMMIT=$(cat .commit) MOE_BACKEND_NVSHMEM_BOOTSTRAP=native
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
for n in 1 128; do
  for k in combine_send_kernel combine_recv_kernel; do
    timeout 60 ncu --section SourceCounters --section WarpStateStats --section LaunchStats -k regex:$k --launch-skip 10 \
      --launch-count 1 --clock-control none -o /tmp/w/${k}_$n \
      python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --num-tokens $n \
      --iters 5 --warmup 10 > $raw/ncu_${k}_$n.log 2>&1
    echo "ncu $k $n rc $? at $(( $(date +%s) - T0 )) s"
    ncu -i /tmp/w/${k}_$n.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $raw/${k}_${n}_sass.csv.gz
    python3 scripts/ncu_groups.py $raw/${k}_${n}_sass.csv.gz --split --runs --top 8 > $raw/groups_${k}_$n.txt 2>&1
    grep -A4 "^split warps" $raw/groups_${k}_$n.txt
    grep -m1 -i "function\|kernel" $raw/groups_${k}_$n.txt
  done
done
tar czf $OUT/call.tgz -C $raw .
