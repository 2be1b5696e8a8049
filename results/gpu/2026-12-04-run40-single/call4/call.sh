#!/bin/bash
# Run 40, call 4 (one H200, `fromx` = main's kernels): is the EP2 prefill combine's 22 us since
# run 22 visible at world size 1? The fused combine forced (the EP2 prefill arena's path; world
# size 1's 4096 source tokens take the two-kernel combine by default) with the whole GPU and with
# kernels sized for 24 SMs, against round 32's 174.7-175.0 / 290.1 us; then one-GPU contract
# variants over the kernel instances round 55's Params change touched (general and tagged-partial
# instances, few SMs, the task contract).
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=fromx MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
MOE_BACKEND_NVSHMEM_COMBINE_FUSED=1 timeout 90 python3 -m moe_backend.cli bench --config deepseek_prefill \
  --backend nvshmem --world-size 1 --sms 24 --out $OUT/prefill_fused_ws1.json > $raw/prefill_fused_ws1.log 2>&1
echo "prefill fused rc $? at $(( $(date +%s) - T0 )) s"; grep -E "^nvshmem" $raw/prefill_fused_ws1.log
F=tests/gpu/test_nvshmem_single.py
timeout 200 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[general-fused]" "$F::test_contract_on_one_gpu[tagged-partials]" \
  "$F::test_contract_with_few_sms_on_one_gpu" "$F::test_contract_tasks_on_one_gpu" > $raw/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $raw/tests.log | tail -6
tar czf $OUT/call.tgz -C $raw .
