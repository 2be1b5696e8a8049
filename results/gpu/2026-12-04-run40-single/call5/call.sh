#!/bin/bash
# Run 40, call 5 (one H200): bisecting call 4's finding, the fused combine at world size 1 with the
# whole GPU 174.7 us in round 32 (5ae93b3's tree) and 193.1 on main. Each earlier commit's whole tree
# (moe_backend, csrc, configs, scripts by `git archive`, its extension built on the CPU machine
# into .ab_prev/SHA) runs the prefill preset with the fused combine forced, in commit order, main's
# build (`fromx`) first and last. Logs and JSON packed into call.tgz.
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
for sha in 5ae93b3 2c3a5b8 bbbf0fa 992bc92 159405a 2ca72bc a19cec6; do  # those carried (64 MiB a call)
  d=.ab_prev/$sha
  ls $d/moe_backend/_C*.so.gz > /dev/null 2>&1 || { echo "$sha: no build"; continue; }
  gunzip -f $d/moe_backend/_C*.so.gz
  bench $d $sha
done
bench $PWD main2
tar czf $OUT/call.tgz -C $raw .
