#!/bin/bash
# Run 41, call 2 (one H200): call 1 put the fused combine's slowdown at world size 1 (prefill,
# fused forced, whole GPU) between 6e3e1c5 (its SASS is 427d059's, 172.4 us) and b024ce2 (192.1).
# Here the commits between: 91d64a9 (round 46, Params ordered for the constant cache) and 159405a
# (round 47, the last before round 48's __grid_constant__ parameters and warm_param_lines), and
# main without warm_param_lines in the fused send (`nowarm`, built from main with that one line).
# main's build (`fromx`) first and last. Logs and JSON packed into call.tgz.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=fromx MOE_BACKEND_COMMIT=$(cat .commit) MOE_BACKEND_NVSHMEM_BOOTSTRAP=native  # no wheels carried
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
bench() {  # tree label
  (cd $1 && PYTHONPATH=$PWD MOE_BACKEND_COMMIT=$2 MOE_BACKEND_NVSHMEM_COMBINE_FUSED=1 timeout 60 python3 -m moe_backend.cli bench \
    --config deepseek_prefill --backend nvshmem --world-size 1 --iters 100 --out $raw/fused_$2.json > $raw/fused_$2.log 2>&1)
  echo "$2 rc $? at $(( $(date +%s) - T0 )) s: $(grep -E '^nvshmem ' $raw/fused_$2.log)"
}
bench $PWD main1
for sha in 91d64a9 159405a; do
  d=.ab_prev/$sha
  ls $d/moe_backend/_C*.so.gz > /dev/null 2>&1 || { echo "$sha: no build"; continue; }
  gunzip -f $d/moe_backend/_C*.so.gz
  bench $d $sha
done
# main with the nowarm build in place of fromx (gpu_env.sh copies the named build into moe_backend/)
cp .devso/nowarm.so moe_backend/_C.cpython-312-x86_64-linux-gnu.so && bench $PWD nowarm
cp .devso/fromx.so moe_backend/_C.cpython-312-x86_64-linux-gnu.so && bench $PWD main2
tar czf $OUT/call.tgz -C $raw .
