#!/usr/bin/env bash
# run 25, call 4: round 36's whole combine as send + PDL receive on the caller's stream: decode A/B, then tests
export out=$OUT/call4; mkdir -p $out
t0=$SECONDS
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1; echo "build $((SECONDS-t0)) s: $(ls moe_backend/_C*.so) commit $(cat .commit)"
N=MOE_BACKEND_NVSHMEM
B="python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1"
for v in "pdl:" "side:${N}_WHOLE_COMBINE=0" "pdl2:" "side2:${N}_WHOLE_COMBINE=0"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 60 $B --out $out/decode_$name.json > /tmp/decode_$name.log 2>&1; echo "bench $name ($envs) rc=$?"
  grep -E "^nvshmem" /tmp/decode_$name.log | cut -c1-200
done
echo "t=$((SECONDS-t0))"
T=tests/gpu/test_nvshmem_single.py
timeout $((560-SECONDS+t0)) python3 -m pytest -m gpu -q -rA -x "$T::test_contract_on_one_gpu[overlap]" "$T::test_rounds_and_graphs_on_one_gpu[overlap]" "$T::test_contract_tasks_on_one_gpu" > $out/tests.log 2>&1; echo "tests rc=$?: $(tail -1 $out/tests.log)"
grep -E "^(PASSED|FAILED|ERROR)" $out/tests.log | cut -c1-150
grep -E "Error|assert" $out/tests.log | head -20 | cut -c1-300
echo "t=$((SECONDS-t0))"
