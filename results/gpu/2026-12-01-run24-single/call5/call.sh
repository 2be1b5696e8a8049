#!/usr/bin/env bash
# run 24, call 5: the combine's smallest slice (SLICE_MIN_ELEMS) and counts to their owner only, world size 1
export out=$OUT/call5; mkdir -p $out
cp .commit $out/commit.txt; cp call.sh $out/; cp tree.diff $out/
source scripts/gpu_env.sh > $out/build.log 2>&1
N=MOE_BACKEND_NVSHMEM
python3 -m pytest -m gpu tests/gpu/test_nvshmem_single.py -q -rA -k "contract_on_one_gpu or rounds" > $out/tests_base.log 2>&1; echo "tests base: $(tail -1 $out/tests_base.log)"
env ${N}_SLICE_MIN_ELEMS=256 python3 -m pytest -m gpu tests/gpu/test_nvshmem_single.py -q -rA -k "contract_on_one_gpu or rounds" > $out/tests_slice256.log 2>&1; echo "tests slice 256: $(tail -1 $out/tests_slice256.log)"
AB_BENCH_ARGS="--world-size 1" timeout 200 scripts/gpu_ab_bench.sh $out/ab deepseek_decode base ${N}_SLICE_MIN_ELEMS=256 base ${N}_SLICE_MIN_ELEMS=256 > /dev/null 2>&1
cat $out/ab/ab.txt
