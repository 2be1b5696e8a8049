#!/usr/bin/env bash
export out=/tmp/call5; mkdir -p $out
save(){ cp .commit $out/commit.txt; tar czf $OUT/call5.tgz -C /tmp call5; }
trap save EXIT
N=MOE_BACKEND_NVSHMEM; F=${N}_COMBINE_FUSED=1
AB_VARIANT=$F AB_BENCH_ARGS="--world-size 1 --sms 24 48 --iters 100" timeout 230 scripts/gpu_ab_build.sh $out/ab deepseek_prefill .ab_prev 2 > $out/ab.log 2>&1
grep -h "combine" $out/ab/ab.txt
source scripts/gpu_env.sh > /dev/null 2>&1
timeout 100 python3 -m pytest -x -q -m gpu tests/gpu/test_nvshmem_single.py -k "bulk-rows or few_sms" > $out/tests1.log 2>&1; echo "tests1 rc=$?" >> $out/tests1.log
tail -3 $out/tests1.log
