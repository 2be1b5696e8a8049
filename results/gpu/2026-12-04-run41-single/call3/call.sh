#!/bin/bash
# Run 41, call 3 (one H200): round 56, the fused combine as its own kernel with its parameters by
# value (combine_fused_kernel; `fixgc`, the working tree) against main (`fromx`), alternately twice:
# prefill at world size 1 with the fused combine forced, the whole GPU, and with kernels for 24 SMs
# (bulk loads) once each; then the tests that run the fused combine on the fix: one-GPU contract
# variants `overlap` and `bulk-rows`, few SMs, rounds and graphs (`overlap`), and EP2 on the shared
# GPU the fused-combine and few-SM contract suites. Logs and JSON packed into call.tgz.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=fromx MOE_BACKEND_COMMIT=$(cat .commit) MOE_BACKEND_NVSHMEM_BOOTSTRAP=native  # no wheels carried
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
so=moe_backend/_C.cpython-312-x86_64-linux-gnu.so
bench() {  # build label [bench args]
  local b=$1 l=$2; shift 2
  cp .devso/$b.so $so
  MOE_BACKEND_NVSHMEM_COMBINE_FUSED=1 timeout 60 python3 -m moe_backend.cli bench --config deepseek_prefill \
    --backend nvshmem --world-size 1 --iters 100 "$@" --out $raw/$l.json > $raw/$l.log 2>&1
  echo "$l rc $? at $(( $(date +%s) - T0 )) s: $(grep -E '^nvshmem ' $raw/$l.log)"
}
bench fromx main1; bench fixgc fix1; bench fromx main2; bench fixgc fix2
bench fromx main_24sm --sms 24; bench fixgc fix_24sm --sms 24
tar czf $OUT/call.tgz -C $raw .  # the benches kept should the tests run past the limit
cp .devso/fixgc.so $so
F=tests/gpu/test_nvshmem_single.py
timeout 200 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[overlap]" "$F::test_contract_on_one_gpu[bulk-rows]" \
  "$F::test_contract_with_few_sms_on_one_gpu" "$F::test_rounds_and_graphs_on_one_gpu[overlap]" > $raw/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests.log | tail -6
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 200 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py \
  -k "test_contract_suite_with_fused_combine or test_contract_suite_with_few_sms" > $raw/tests_ep2.log 2>&1
echo "pytest EP2-shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests_ep2.log | tail -6
tar czf $OUT/call.tgz -C $raw .
