#!/usr/bin/env bash
export out=/tmp/call4; mkdir -p $out
save(){ cp .commit $out/commit.txt; tar czf $OUT/call4.tgz -C /tmp call4; }
trap save EXIT
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1
N=MOE_BACKEND_NVSHMEM; F=${N}_COMBINE_FUSED=1
timeout 150 python3 -m pytest -x -q -m gpu tests/gpu/test_build.py tests/gpu/test_nvshmem_single.py -k "build or bulk-rows or few_sms or probe" > $out/tests.log 2>&1; echo "tests rc=$?" >> $out/tests.log
tail -3 $out/tests.log
env $F timeout 90 python3 -m moe_backend.cli bench --config deepseek_prefill --backend nvshmem --world-size 1 --sms 24 48 --iters 100 --out $out/bench_prefill_ws1.json > $out/bench_prefill.log 2>&1
grep -E "combine|dispatch" $out/bench_prefill.log | head -8
timeout 60 python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --out $out/bench_decode_ws1.json > $out/bench_decode.log 2>&1
grep -E "combine|dispatch" $out/bench_decode.log | head -8
