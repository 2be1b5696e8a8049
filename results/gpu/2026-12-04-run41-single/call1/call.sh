#!/bin/bash
# Run 41, call 1 (one H200): run 40's bisection of the fused combine's slowdown at world size 1
# (round 32 / 992bc92 174 us, a19cec6 and main 192 us with the whole GPU) on three more commits:
# 427d059 (round 44's rolled loops, the fused kernel's SASS 3640 -> 3136 instructions), b024ce2
# (rounds 46-48: Params order, __grid_constant__), 6930ff4 (round 50's grids). Each commit's tree
# (moe_backend, csrc, configs, scripts by `git archive`, its extension built on the CPU machine
# into .ab_prev/SHA) runs the prefill preset with the fused combine forced; main's build
# (`fromx`) first and last. Logs and JSON packed into call.tgz.
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
for sha in 427d059 b024ce2 6930ff4; do
  d=.ab_prev/$sha
  ls $d/moe_backend/_C*.so.gz > /dev/null 2>&1 || { echo "$sha: no build"; continue; }
  gunzip -f $d/moe_backend/_C*.so.gz
  bench $d $sha
done
bench $PWD main2
tar czf $OUT/call.tgz -C $raw .
