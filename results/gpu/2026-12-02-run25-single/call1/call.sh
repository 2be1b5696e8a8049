#!/usr/bin/env bash
# run 25, call 1: the review form of the fused dispatch on one H200 (tests, decode bench), then the host profile
export out=$OUT/call1; mkdir -p $out
cp .commit $out/commit.txt; cp call.sh $out/
t0=$SECONDS
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1; echo "build $((SECONDS-t0)) s: $(ls moe_backend/_C*.so)"
timeout 240 python3 -m pytest -m gpu -q -rA tests/gpu/test_nvshmem_single.py > $out/tests.log 2>&1; echo "single tests rc=$?: $(tail -1 $out/tests.log)"
grep -E "^(PASSED|FAILED|ERROR)" $out/tests.log | cut -c1-150
echo "t=$((SECONDS-t0))"
timeout 60 python3 -m moe_backend.cli bench --config deepseek_decode --backend all --world-size 1 --out $out/decode.json > $out/decode.log 2>&1; echo "bench rc=$?"
grep -E "^backend|^nvshmem|^reference" $out/decode.log | cut -c1-200
echo "t=$((SECONDS-t0))"
timeout 120 python3 scripts/profile_host.py $out --world-size 1 --iters 300 > $out/profile.log 2>&1; echo "profile rc=$?"
head -40 $out/profile.log
echo "t=$((SECONDS-t0))"
