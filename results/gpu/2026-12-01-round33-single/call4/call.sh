#!/usr/bin/env bash
export out=/tmp/call4; mkdir -p $out
save(){ cp .commit $out/commit.txt; cp call.sh $out/; find $out -name "*.ncu-rep" -delete; tar czf $OUT/call4.tgz -C /tmp call4; }
trap save EXIT
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1
N=MOE_BACKEND_NVSHMEM
timeout 200 python3 -m pytest -x -q -m gpu tests/gpu/test_nvshmem_single.py > $out/tests.log 2>&1; echo "tests rc=$?" >> $out/tests.log
tail -3 $out/tests.log
AB_BENCH_ARGS="--world-size 1 --sms 48 --iters 60" timeout 200 scripts/gpu_ab_bench.sh $out/ab deepseek_prefill base ${N}_PLAN_VEC=0 base ${N}_PLAN_VEC=0 ${N}_COPY_BULK=0 > /dev/null 2>&1
cat $out/ab/ab.txt
timeout 50 python3 scripts/profile_timeline.py $out/timeline prefill --world-size 1 > $out/timeline.log 2>&1
grep -A12 "overlap=1" $out/timeline/timeline.txt | head -14
