#!/bin/bash
# Run 36, call 2 (round 49): what the tagged partials' code costs the untagged path, and the
# threshold. notag = the working tree with the tagged code compiled out (TAGGABLE false in both
# combine kernels; the same Python), llc = the working tree. Decode at world size 1, nvlink,
# alternately twice: notag, llc with LL_COMBINE=0, =16, =128; then notag and llc (default)
# with `--backend all` (the put transport shares the receive kernel).
set -u
out=$OUT; mkdir -p $out /tmp/w
for v in notag llc; do gunzip -f .devso/$v.so.gz; done
export MOE_BACKEND_DEVSO=llc MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend nvshmem" timeout 240 bash scripts/gpu_ab_bench.sh /tmp/w/ab deepseek_decode \
  MOE_BACKEND_DEVSO=notag MOE_BACKEND_DEVSO=llc,${N}_LL_COMBINE=0 MOE_BACKEND_DEVSO=llc,${N}_LL_COMBINE=16 MOE_BACKEND_DEVSO=llc,${N}_LL_COMBINE=128 \
  MOE_BACKEND_DEVSO=notag MOE_BACKEND_DEVSO=llc,${N}_LL_COMBINE=0 MOE_BACKEND_DEVSO=llc,${N}_LL_COMBINE=16 MOE_BACKEND_DEVSO=llc,${N}_LL_COMBINE=128 \
  > /tmp/w/ab.log 2>&1
echo "ab rc $? at $(( $(date +%s) - T0 )) s"; cat /tmp/w/ab/ab.txt
AB_BENCH_ARGS="--world-size 1 --backend all" timeout 120 bash scripts/gpu_ab_bench.sh /tmp/w/ab_all deepseek_decode \
  MOE_BACKEND_DEVSO=notag MOE_BACKEND_DEVSO=llc > /tmp/w/ab_all.log 2>&1
echo "ab_all rc $? at $(( $(date +%s) - T0 )) s"; grep -v reference /tmp/w/ab_all/ab.txt
(cd /tmp/w && tar czf $out/ab.tgz ab ab.log ab_all ab_all.log)
