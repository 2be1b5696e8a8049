#!/bin/bash
# Run 35, call 1 (round 47): the put transport's direct table in fewer puts: block 0 puts the
# header with its entries in one put, the last table block writes and puts the counts (with one
# token the two blocks work in parallel; before, block 0 made three puts a rank). r47 = main's
# kernels (91d64a9/763bbf0), r49 = r47 + this change. Decode at world size 1, `--backend all`
# (put and nvlink), builds alternately twice, r49 with DIRECT_TABLE_BLOCKS=4 once; ncu of both
# builds' 1-token put fused dispatch; then tests on r49: one-GPU contract, EP2 on the shared GPU.
set -u
out=$OUT; mkdir -p $out
for v in r47 r49; do gunzip -f .devso/$v.so.gz; done
export MOE_BACKEND_DEVSO=r47 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
N=MOE_BACKEND_NVSHMEM
AB_BENCH_ARGS="--world-size 1 --backend all" timeout 300 bash scripts/gpu_ab_bench.sh $out/ab deepseek_decode \
  MOE_BACKEND_DEVSO=r47 MOE_BACKEND_DEVSO=r49 MOE_BACKEND_DEVSO=r47 MOE_BACKEND_DEVSO=r49 \
  MOE_BACKEND_DEVSO=r49,${N}_DIRECT_TABLE_BLOCKS=4 > /dev/null 2>&1
echo "ab rc $? at $(( $(date +%s) - T0 )) s"; grep -v reference $out/ab/ab.txt
source scripts/gpu_env.sh > /dev/null 2>&1
mkdir -p /tmp/w/p
for v in r47 r49; do
  MOE_BACKEND_DEVSO=$v source scripts/gpu_devso.sh
  timeout 60 ncu --section WarpStateStats --section SourceCounters --cache-control none --clock-control none \
    -k regex:dispatch_fused_kernel --launch-skip 5 --launch-count 1 -o /tmp/w/fused_put_$v \
    python3 -m moe_backend.cli bench --config deepseek_decode --backend all --world-size 1 --iters 5 --warmup 2 --num-tokens 1 > /tmp/w/fused_put_$v.log 2>&1
  ncu -i /tmp/w/fused_put_$v.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $out/fused_put1_${v}_sass.csv.gz
  ncu -i /tmp/w/fused_put_$v.ncu-rep --page details --csv 2>/dev/null | grep -E '"Duration"|Kernel Name' | head -3 > $out/fused_put1_${v}_details.txt
  echo "$v put fused 1 token: $(grep -o 'dispatch_fused_kernel<[^>]*>' $out/fused_put1_${v}_details.txt | head -1)"
  python3 scripts/ncu_groups.py $out/fused_put1_${v}_sass.csv.gz --runs --top 8 --groups 0 | tee $out/fused_put1_${v}.txt | grep -E "code run|stall_no_inst|stall_imc|stall_barrier|stall_long"
done
echo "ncu done at $(( $(date +%s) - T0 )) s"
MOE_BACKEND_DEVSO=r49 source scripts/gpu_devso.sh
F=tests/gpu/test_nvshmem_single.py
timeout 150 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[overlap]" "$F::test_contract_on_one_gpu[self-send]" \
  "$F::test_contract_on_one_gpu[split-dispatch]" "$F::test_contract_on_one_gpu[untagged]" > $out/tests.log 2>&1
echo "pytest one-GPU (r49) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -6
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 90 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "both_transports" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared (r49) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -4
