#!/bin/bash
# Run 39, call 5 (`bycall`, as call 3): the per-call default against every call by PDL
# (WHOLE_COMBINE=1, round 52's default) over the sweep (an arena per size, 1-4096 tokens, bf16)
# and the decode arena per size (fp8 + scales / bf16), once each, world size 1, nvlink.
set -u
out=$OUT; mkdir -p $out /tmp/w
gunzip -f .devso/bycall.so.gz
export MOE_BACKEND_DEVSO=bycall MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 150 bash scripts/gpu_ab_bench.sh /tmp/w/ab_sweep deepseek_sweep \
  base ${N}_WHOLE_COMBINE=1 > /tmp/w/ab_sweep.log 2>&1
echo "ab sweep rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_sweep/ab.txt
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 90 bash scripts/gpu_ab_bench.sh /tmp/w/ab_each deepseek_decode_each \
  base ${N}_WHOLE_COMBINE=1 > /tmp/w/ab_each.log 2>&1
echo "ab each rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab_each/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab_sweep ab_sweep.log ab_each ab_each.log)
