#!/bin/bash
# Run 42, call 6 (one H200): round 58, the combine receive waits for one flag a holding rank where
# the send's slices are its own (`oneflag`, the working tree on f306bf8+), against main (`gcall`,
# f306bf8): decode at world size 1 alternately twice, decode under SELF_SEND on both transports and
# prefill with the fused combine forced once each; then the tests of the combine receive: one-GPU
# contract variants, few SMs, rounds and graphs; EP2 on the shared GPU both transports, the
# fused-combine suite and the timeout test.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=oneflag MOE_BACKEND_COMMIT=$(cat .commit) MOE_BACKEND_NVSHMEM_BOOTSTRAP=native
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
D=MOE_BACKEND_DEVSO
AB_BENCH_ARGS="--world-size 1" timeout 150 bash scripts/gpu_ab_bench.sh $raw/ab_decode deepseek_decode \
  $D=gcall $D=oneflag $D=gcall $D=oneflag > $raw/ab_decode.log 2>&1
echo "ab decode rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_decode/ab.txt
MOE_BACKEND_NVSHMEM_SELF_SEND=1 AB_BENCH_ARGS="--world-size 1 --backend all" timeout 100 bash scripts/gpu_ab_bench.sh \
  $raw/ab_decode_self deepseek_decode $D=gcall $D=oneflag > $raw/ab_decode_self.log 2>&1
echo "ab decode self-send rc $? at $(( $(date +%s) - T0 )) s"; grep nvshmem $raw/ab_decode_self/ab.txt
MOE_BACKEND_NVSHMEM_COMBINE_FUSED=1 AB_BENCH_ARGS="--world-size 1 --iters 100" timeout 100 bash scripts/gpu_ab_bench.sh \
  $raw/ab_prefill deepseek_prefill $D=gcall $D=oneflag > $raw/ab_prefill.log 2>&1
echo "ab prefill rc $? at $(( $(date +%s) - T0 )) s"; cat $raw/ab_prefill/ab.txt
tar czf $OUT/call.tgz -C $raw .
cp .devso/oneflag.so moe_backend/_C.cpython-312-x86_64-linux-gnu.so
F=tests/gpu/test_nvshmem_single.py
C="$F::test_contract_on_one_gpu"
timeout 150 python3 -m pytest -q -m gpu -rA "$C[untagged]" "$C[side-combine]" "$C[pdl-combine]" "$C[self-send]" \
  "$C[untagged-partials]" "$C[mixed-partials]" "$F::test_contract_with_few_sms_on_one_gpu" \
  "$F::test_rounds_and_graphs_on_one_gpu[untagged]" > $raw/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "FAILED|ERROR|passed|failed" $raw/tests.log | tail -6
tar czf $OUT/call.tgz -C $raw .
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 120 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py \
  -k "test_contract_suite_both_transports or test_contract_suite_with_fused_combine or test_timeout_names_phase_and_peer" \
  > $raw/tests_ep2.log 2>&1
echo "pytest EP2-shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "FAILED|ERROR|passed|failed" $raw/tests_ep2.log | tail -6
tar czf $OUT/call.tgz -C $raw .
