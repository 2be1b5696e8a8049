#!/usr/bin/env bash
# run 25, call 3: round 36's whole combine at world size 1: decode A/B (on / off / on with register loads), host profile, tests
export out=$OUT/call3; mkdir -p $out
t0=$SECONDS
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1; echo "build $((SECONDS-t0)) s: $(ls moe_backend/_C*.so) commit $(cat .commit)"
N=MOE_BACKEND_NVSHMEM
B="python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1"
for v in "whole:" "split:${N}_WHOLE_COMBINE=0" "regs:${N}_COMBINE_ASYNC=0" "whole2:" "split2:${N}_WHOLE_COMBINE=0"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 60 $B --out $out/decode_$name.json > /tmp/decode_$name.log 2>&1; echo "bench $name ($envs) rc=$?"
  grep -E "^backend|^nvshmem" /tmp/decode_$name.log | cut -c1-200
done
rm -f $out/decode_whole2.json $out/decode_split2.json
echo "t=$((SECONDS-t0))"
timeout 90 python3 scripts/profile_host.py $out --world-size 1 --iters 300 > /dev/null 2>&1; echo "profile rc=$?"
sed -n 2,24p $out/profile_host.txt
rm -f $out/profile_host.json
echo "t=$((SECONDS-t0))"
T=tests/gpu/test_nvshmem_single.py
timeout $((590-SECONDS+t0)) python3 -m pytest -m gpu -q -rA "$T::test_contract_on_one_gpu[overlap]" "$T::test_contract_tasks_on_one_gpu" "$T::test_rounds_and_graphs_on_one_gpu[overlap]" "$T::test_contract_on_one_gpu[untagged]" > $out/tests.log 2>&1; echo "tests rc=$?: $(tail -1 $out/tests.log)"
grep -E "^(PASSED|FAILED|ERROR)" $out/tests.log | cut -c1-150
grep -E "Error|assert" $out/tests.log | head -20 | cut -c1-300
echo "t=$((SECONDS-t0))"
