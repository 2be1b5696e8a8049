#!/bin/bash
# Run 42, call 2 (one H200): the combine receive's flags waited for by the whole warp
# (wait_flags_warp) and its sources stored without a per-lane loop (`warpw`, the working tree),
# against main (`fromx`); `warpwgc` is the same with __grid_constant__ on the fused kernel
# (MOE_BACKEND_FUSED_GRID_CONSTANT=1), whose receive call 1 found run by split warps.
# Prefill at world size 1, fused combine forced, the three builds alternately twice, compared with
# `moe-backend compare`; `ncu` of the fused kernel on warpw and warpwgc (--split); the decode preset
# (receive kernel changed too) fromx / warpw alternately twice; then the tests that run the
# combine receive: one-GPU contract variants, few SMs, rounds and graphs, the timeout test and
# EP2 on the shared GPU the fused-combine and few-SM contract suites.
set -u
raw=$OUT/raw; mkdir -p $raw /tmp/w
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=warpw MOE_BACKEND_COMMIT=$(cat .commit) MOE_BACKEND_NVSHMEM_BOOTSTRAP=native
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
so=moe_backend/_C.cpython-312-x86_64-linux-gnu.so
D=MOE_BACKEND_DEVSO
MOE_BACKEND_NVSHMEM_COMBINE_FUSED=1 AB_BENCH_ARGS="--world-size 1 --iters 100" timeout 240 bash scripts/gpu_ab_bench.sh \
  $raw/ab_prefill deepseek_prefill $D=fromx $D=warpw $D=warpwgc $D=fromx $D=warpw $D=warpwgc > $raw/ab_prefill.log 2>&1
echo "ab prefill rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_prefill/ab.txt
for n in 2 3; do python3 -m moe_backend.cli compare $raw/ab_prefill/bench_1_${D}_fromx.json \
  $raw/ab_prefill/bench_${n}_*.json --phases combine combine_recv; done | tee $raw/compare_prefill.txt
tar czf $OUT/call.tgz -C $raw .
for b in warpw warpwgc; do
  cp .devso/$b.so $so
  MOE_BACKEND_NVSHMEM_COMBINE_FUSED=1 timeout 90 ncu --section SpeedOfLight --section SourceCounters --section WarpStateStats \
    -k regex:combine_fused_kernel --launch-skip 4 --launch-count 1 --clock-control none -o /tmp/w/$b \
    python3 -m moe_backend.cli bench --config deepseek_prefill --backend nvshmem --world-size 1 --iters 5 --warmup 2 \
    > $raw/ncu_$b.log 2>&1
  echo "ncu $b rc $? at $(( $(date +%s) - T0 )) s"
  ncu -i /tmp/w/$b.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $raw/${b}_sass.csv.gz
  python3 scripts/ncu_groups.py $raw/${b}_sass.csv.gz --split --top 6 > $raw/groups_$b.txt 2>&1
  ncu -i /tmp/w/$b.ncu-rep --page details 2>&1 | grep -E " Duration|Executed Instructions  " | head -3
  grep -A3 "^split warps" $raw/groups_$b.txt
done
AB_BENCH_ARGS="--world-size 1" timeout 150 bash scripts/gpu_ab_bench.sh $raw/ab_decode deepseek_decode \
  $D=fromx $D=warpw $D=fromx $D=warpw > $raw/ab_decode.log 2>&1
echo "ab decode rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_decode/ab.txt
tar czf $OUT/call.tgz -C $raw .
cp .devso/warpw.so $so
F=tests/gpu/test_nvshmem_single.py
C="$F::test_contract_on_one_gpu"
timeout 200 python3 -m pytest -q -m gpu -rA "$C[overlap]" "$C[no-overlap]" "$C[untagged]" "$C[bulk-rows]" "$C[side-combine]" \
  "$C[pdl-combine]" "$C[self-send]" "$C[untagged-partials]" "$C[mixed-partials]" "$F::test_contract_with_few_sms_on_one_gpu" \
  "$F::test_rounds_and_graphs_on_one_gpu[overlap]" "$F::test_rounds_and_graphs_on_one_gpu[untagged]" \
  "$F::test_whole_combine_by_call" > $raw/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "FAILED|ERROR|passed|failed" $raw/tests.log | tail -6
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py \
  -k "test_contract_suite_with_fused_combine or test_contract_suite_with_few_sms or test_timeout_names_phase_and_peer" \
  > $raw/tests_ep2.log 2>&1
echo "pytest EP2-shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "FAILED|ERROR|passed|failed" $raw/tests_ep2.log | tail -6
tar czf $OUT/call.tgz -C $raw .
