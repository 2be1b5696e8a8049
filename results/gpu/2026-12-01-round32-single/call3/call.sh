#!/usr/bin/env bash
export out=/tmp/call3; mkdir -p $out
save(){ cp .commit $out/commit.txt; find $out -name "*.ncu-rep" -delete; tar czf $OUT/call3.tgz -C /tmp call3; }
trap save EXIT
N=MOE_BACKEND_NVSHMEM; F=${N}_COMBINE_FUSED=1
AB_VARIANT=$F AB_BENCH_ARGS="--world-size 1 --sms 24 48 --iters 100" timeout 280 scripts/gpu_ab_build.sh $out/ab deepseek_prefill .ab_prev 2 > $out/ab.log 2>&1
grep -h "combine" $out/ab/ab.txt
source scripts/gpu_env.sh > /dev/null 2>&1
timeout 130 python3 -m pytest -x -q -m gpu tests/gpu/test_nvshmem_single.py -k "bulk-rows or few_sms" > $out/tests1.log 2>&1; echo "tests1 rc=$?" >> $out/tests1.log
tail -3 $out/tests1.log
env $F timeout 90 ncu --set full --import-source yes -k regex:combine_send --launch-skip 13 --launch-count 1 --clock-control none -o $out/ncu24 python3 -m moe_backend.cli bench --config deepseek_prefill --backend nvshmem --world-size 1 --sms 24 --iters 3 > $out/ncu.log 2>&1
ncu --import $out/ncu24.ncu-rep --page details > $out/details.txt 2>&1
ncu --import $out/ncu24.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $out/sass.csv.gz
grep -E "Duration|Executed Ipc A|Executed Instructions  " $out/details.txt | head -4
