#!/usr/bin/env bash
export out=/tmp/call1; mkdir -p $out
save(){ cp .commit $out/commit.txt; find $out -name "*.ncu-rep" -delete; tar czf $OUT/call1.tgz -C /tmp call1; }
trap save EXIT
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1
N=MOE_BACKEND_NVSHMEM; F=${N}_COMBINE_FUSED=1
timeout 200 python3 -m pytest -x -q -m gpu tests/gpu/test_nvshmem_single.py -k "bulk-rows or few_sms" > $out/tests1.log 2>&1; echo "tests1 rc=$?" >> $out/tests1.log
tail -3 $out/tests1.log
grep -q "rc=0" $out/tests1.log || exit 1
AB_VARIANT=$F AB_BENCH_ARGS="--world-size 1 --sms 24 48 --iters 100" timeout 330 scripts/gpu_ab_build.sh $out/ab deepseek_prefill .ab_prev 2 > $out/ab.log 2>&1
grep -h "combine" $out/ab/ab.txt | head -40
env $F timeout 120 ncu --set full --import-source yes -k regex:combine_send --launch-skip 13 --launch-count 1 --clock-control none -o $out/ncu24 python3 -m moe_backend.cli bench --config deepseek_prefill --backend nvshmem --world-size 1 --sms 24 --iters 3 > $out/ncu.log 2>&1
ncu --import $out/ncu24.ncu-rep --page details > $out/details.txt 2>&1
ncu --import $out/ncu24.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $out/sass.csv.gz
grep -E "Duration|Executed Ipc A|Instructions" $out/details.txt | head
timeout 150 python3 -m pytest -x -q -m gpu tests/gpu/test_nvshmem_single.py -k "not bulk-rows and not few_sms" > $out/tests2.log 2>&1; echo "tests2 rc=$?" >> $out/tests2.log
tail -3 $out/tests2.log
