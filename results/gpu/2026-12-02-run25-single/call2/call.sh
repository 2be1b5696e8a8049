#!/usr/bin/env bash
# run 25, call 2: host-time changes; host profile and decode bench at world size 1, then the one-GPU tests not run in call 1
export out=$OUT/call2; mkdir -p $out
cp .commit $out/commit.txt
t0=$SECONDS
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1; echo "build $((SECONDS-t0)) s: $(ls moe_backend/_C*.so)"
timeout 90 python3 scripts/profile_host.py $out --world-size 1 --iters 300 > /dev/null 2>&1; echo "profile rc=$?"
sed -n 2,24p $out/profile_host.txt
echo "t=$((SECONDS-t0))"
timeout 60 python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --out $out/decode.json > $out/decode.log 2>&1; echo "bench rc=$?"
grep -E "^backend|^nvshmem" $out/decode.log | cut -c1-200
echo "t=$((SECONDS-t0))"
T=tests/gpu/test_nvshmem_single.py
timeout $((590-SECONDS+t0)) python3 -m pytest -m gpu -q -rA $T -k "register-copy or split-dispatch or tasks or bulk_load or rounds or few_sms" > $out/tests.log 2>&1; echo "tests rc=$?: $(tail -1 $out/tests.log)"
grep -E "^(PASSED|FAILED|ERROR)" $out/tests.log | cut -c1-150
echo "t=$((SECONDS-t0))"
