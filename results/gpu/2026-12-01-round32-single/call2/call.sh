#!/usr/bin/env bash
export out=/tmp/call2; mkdir -p $out
save(){ cp .commit $out/commit.txt; find $out -name "*.ncu-rep" -delete; tar czf $OUT/call2.tgz -C /tmp call2; }
trap save EXIT
N=MOE_BACKEND_NVSHMEM; F=${N}_COMBINE_FUSED=1
AB_VARIANT=$F AB_BENCH_ARGS="--world-size 1 --sms 24 --iters 100" timeout 260 scripts/gpu_ab_build.sh $out/ab deepseek_prefill .ab_prev 2 > $out/ab.log 2>&1
grep -h "combine" $out/ab/ab.txt
source scripts/gpu_env.sh > /dev/null 2>&1
AB_BENCH_ARGS="--world-size 1 --sms 48 --iters 100" timeout 80 scripts/gpu_ab_bench.sh $out/ab48 deepseek_prefill $F $F,${N}_COMBINE_BULK=0 > $out/ab48.log 2>&1
grep -h "combine" $out/ab48/ab.txt
timeout 250 python3 -m pytest -x -q -m gpu tests/gpu/test_nvshmem_single.py -k "not bulk-rows and not few_sms" > $out/tests2.log 2>&1; echo "tests2 rc=$?" >> $out/tests2.log
tail -3 $out/tests2.log
