#!/usr/bin/env bash
export out=/tmp/call3; mkdir -p $out
save(){ cp .commit $out/commit.txt; cp call.sh $out/; find $out -name "*.ncu-rep" -delete; tar czf $OUT/call3.tgz -C /tmp call3; }
trap save EXIT
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1
N=MOE_BACKEND_NVSHMEM
env ${N}_COPY_BULK=1 timeout 150 python3 -m pytest -x -q -m gpu tests/gpu/test_nvshmem_single.py -k "few_sms or (contract_on_one_gpu and overlap and not no)" > $out/tests.log 2>&1; echo "tests rc=$?" >> $out/tests.log
tail -3 $out/tests.log
AB_BENCH_ARGS="--world-size 1 --sms 24 48 --iters 60" timeout 240 scripts/gpu_ab_bench.sh $out/ab deepseek_prefill base ${N}_COPY_BULK=1 base ${N}_COPY_BULK=1 > /dev/null 2>&1
cat $out/ab/ab.txt
env ${N}_COPY_BULK=1 timeout 60 python3 scripts/profile_timeline.py $out/timeline prefill --world-size 1 > $out/timeline.log 2>&1
grep -A12 "overlap=1" $out/timeline/timeline.txt | head -14
env ${N}_COPY_BULK=1 timeout 100 ncu --set full -k regex:dispatch_copy --launch-skip 4 --launch-count 1 --clock-control none -o $out/copy python3 -m moe_backend.cli bench --config deepseek_prefill --backend nvshmem --world-size 1 --iters 5 > $out/ncu.log 2>&1
ncu -i $out/copy.ncu-rep --page details > $out/details.txt 2>&1
grep -E "dispatch_|Duration|DRAM Throughput|Executed Ipc A|Achieved Occupancy|Issued Instructions  " $out/details.txt | head -20
