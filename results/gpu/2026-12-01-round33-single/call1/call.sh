#!/usr/bin/env bash
export out=/tmp/call1; mkdir -p $out
save(){ cp .commit $out/commit.txt; cp call.sh $out/; find $out -name "*.ncu-rep" -delete; tar czf $OUT/call1.tgz -C /tmp call1; }
trap save EXIT
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --sms 48 --iters 60" timeout 300 scripts/gpu_ab_bench.sh $out/ab deepseek_prefill base ${N}_COPY_MODE=1 ${N}_COPY_MODE=2 ${N}_COPY_MODE=3 base ${N}_COPY_MODE=1 ${N}_COPY_MODE=2 ${N}_COPY_MODE=3 > /dev/null 2>&1
cat $out/ab/ab.txt
timeout 60 python3 scripts/profile_timeline.py $out/timeline prefill --world-size 1 > $out/timeline.log 2>&1
grep -A12 "overlap=1" $out/timeline/timeline.txt | head -30
timeout 120 ncu --set full --import-source yes -k regex:dispatch_ --launch-skip 12 --launch-count 3 --clock-control none -o $out/copy python3 -m moe_backend.cli bench --config deepseek_prefill --backend nvshmem --world-size 1 --iters 5 > $out/ncu.log 2>&1
ncu -i $out/copy.ncu-rep --page details > $out/details.txt 2>&1
ncu -i $out/copy.ncu-rep --page source --csv --print-source sass -k regex:dispatch_copy 2>/dev/null | gzip > $out/sass_copy.csv.gz
grep -E "dispatch_|Duration|DRAM Throughput|Memory Throughput|Executed Ipc A|Achieved Occupancy" $out/details.txt | head -40
