#!/usr/bin/env bash
# run 24, call 6: round 35's fused dispatch at world size 1: tests, then the decode bench with and without it
export out=$OUT/call6; mkdir -p $out
cp .commit $out/commit.txt; cp call.sh $out/; cp tree.diff $out/
t0=$SECONDS
rm -f moe_backend/_C*.so
source scripts/gpu_env.sh > $out/build.log 2>&1; echo "build $((SECONDS-t0)) s: $(ls moe_backend/_C*.so)"
N=MOE_BACKEND_NVSHMEM
T=tests/gpu/test_nvshmem_single.py
timeout 60 python3 -m pytest -m gpu -q -rA -x "$T::test_contract_on_one_gpu[overlap]" > $out/tests1.log 2>&1; echo "contract (fused) rc=$?: $(tail -1 $out/tests1.log)"
timeout 40 python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --out $out/decode.json > $out/decode.log 2>&1; echo "bench rc=$?"
grep -E "^backend|^nvshmem" $out/decode.log
timeout 60 python3 -m pytest -m gpu -q -rA -x "$T::test_rounds_and_graphs_on_one_gpu[overlap]" > $out/tests2.log 2>&1; echo "rounds+graphs rc=$?: $(tail -1 $out/tests2.log)"
env ${N}_FUSED_DISPATCH=0 timeout 40 python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --out $out/decode_split.json > $out/decode_split.log 2>&1; echo "bench FUSED_DISPATCH=0 rc=$?"
grep -E "^nvshmem" $out/decode_split.log
