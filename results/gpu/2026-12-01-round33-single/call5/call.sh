#!/usr/bin/env bash
export out=/tmp/call5; mkdir -p $out
save(){ cp .commit $out/commit.txt; cp call.sh $out/; tar czf $OUT/call5.tgz -C /tmp call5; }
trap save EXIT
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --iters 100" timeout 150 scripts/gpu_ab_bench.sh $out/ab_mixtral mixtral base ${N}_COPY_BULK=0 base ${N}_COPY_BULK=0 > /dev/null 2>&1
cat $out/ab_mixtral/ab.txt
timeout 60 python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --out $out/bench_decode_ws1.json > $out/bench_decode.log 2>&1
grep -E "combine|dispatch" $out/bench_decode.log | head -8
