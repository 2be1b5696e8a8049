#!/bin/bash
# Run 43 on `nvidia-h200` (one GPU; the two-GPU machine no longer lent), call 1 (`newdef`: main's
# kernels with run 43's defaults: the fused combine past the overlap limit, bulk row loads, the
# copy-engine chunks shrinking by 0.6). What one GPU can check of them: the EP2 tests of the fused
# combine (now with a cp.async pass) and of few SMs with both ranks on the GPU; the one-GPU
# contract variants `overlap` (the fused combine by default now) and `async-rows`; then at world
# size 1 the fused combine (the default) against two kernels in an arena per prefill size.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=newdef MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
N=MOE_BACKEND_NVSHMEM
pack() { tar czf $OUT/call.tgz -C $raw .; }
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 220 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py \
  -k "fused_combine or few_sms" > $raw/tests_shared.log 2>&1
echo "EP2 shared-GPU tests rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests_shared.log | tail -4
pack
timeout 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k "async-rows or [overlap]" > $raw/tests_single.log 2>&1
echo "one-GPU tests rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests_single.log | tail -4
pack
AB_BENCH_ARGS="--backend nvshmem" timeout 100 bash scripts/gpu_ab_bench.sh $raw/ab_ws1 \
  results/gpu/2026-12-04-run43-x2/call4/prefill_ws1_each.yaml base ${N}_COMBINE_FUSED=0 base ${N}_COMBINE_FUSED=0 > $raw/ab_ws1.log 2>&1
echo "ab ws1 rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_ws1/ab.txt
pack
