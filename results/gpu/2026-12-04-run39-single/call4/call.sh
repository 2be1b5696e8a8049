#!/bin/bash
# Run 39, call 4 (`bycall`, as call 3): call 3's one-GPU pytest reached its 170 s limit during its
# last test, the contract's `overlap` variant (four tests had passed). That test alone, with a
# longer limit and its duration reported.
set -u
out=$OUT; mkdir -p $out
gunzip -f .devso/bycall.so.gz
export MOE_BACKEND_DEVSO=bycall MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
timeout 400 python3 -m pytest -q -m gpu -rA -s --durations=0 "tests/gpu/test_nvshmem_single.py::test_contract_on_one_gpu[overlap]" \
  > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed|call " $out/tests.log | tail -8
