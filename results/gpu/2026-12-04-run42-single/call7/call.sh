#!/bin/bash
# Run 42, call 7 (one H200): the one-GPU tests call 6 did not reach in its 150 s, on `oneflag`.
set -u
raw=$OUT/raw; mkdir -p $raw
for f in .devso/*.so.gz; do gunzip -f $f; done
export MOE_BACKEND_DEVSO=oneflag MOE_BACKEND_NVSHMEM_BOOTSTRAP=native
source scripts/gpu_env.sh > /dev/null 2>&1
F=tests/gpu/test_nvshmem_single.py; C="$F::test_contract_on_one_gpu"
timeout 100 python3 -m pytest -q -m gpu -rA --durations=0 "$C[untagged-partials]" "$C[mixed-partials]" \
  "$F::test_contract_with_few_sms_on_one_gpu" "$F::test_rounds_and_graphs_on_one_gpu[untagged]" > $raw/tests.log 2>&1
echo "pytest rc $?"; grep -E "PASSED|FAILED|ERROR|passed|failed|s call" $raw/tests.log | tail -12
