#!/bin/bash
# Device call 7 (run 27, b91027b; kernels as 10eb614): the prefill dispatch's cross-rank path at
# world size 1 (SELF_SEND; the copy-engine send by default there, the send kernel with CE_SEND=0),
# a proxy for the EP2 prefill's structure, and its GPU timeline.
set -u
out=$OUT; mkdir -p $out /tmp/w
N=MOE_BACKEND_NVSHMEM
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit)"
T0=$(date +%s)
S=${N}_SELF_SEND=1
AB_BENCH_ARGS="--world-size 1" timeout 250 scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_prefill base $S $S,${N}_CE_SEND=0 > /dev/null 2>&1
cp /tmp/w/ab/ab.txt $out/ab_prefill.txt; cat $out/ab_prefill.txt
echo "benches done at $(( $(date +%s) - T0 )) s"
env $S timeout 150 python3 scripts/profile_timeline.py /tmp/w/tl deepseek-prefill --world-size 1 > $out/timeline_prefill.log 2>&1
cp /tmp/w/tl/timeline.txt $out/timeline_prefill_self.txt 2>/dev/null
head -60 $out/timeline_prefill_self.txt 2>/dev/null || tail -20 $out/timeline_prefill.log
echo "all done at $(( $(date +%s) - T0 )) s"
