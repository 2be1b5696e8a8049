#!/bin/bash
# Run 34, call 2: call 1's one-GPU tests on r47 (the reordered Params) stopped at its 150 s limit
# after two passed; the rest here with room: pdl-combine, few SMs, rounds and graphs with PDL.
set -u
out=$OUT; mkdir -p $out
gunzip -f .devso/r47.so.gz
MOE_BACKEND_DEVSO=r47 source scripts/gpu_env.sh > /tmp/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"
T0=$(date +%s)
F=tests/gpu/test_nvshmem_single.py
timeout 330 python3 -m pytest -q -m gpu -rA --durations=0 "$F::test_contract_on_one_gpu[pdl-combine]" \
  "$F::test_contract_with_few_sms_on_one_gpu" "$F::test_rounds_and_graphs_on_one_gpu[pdl-combine]" > $out/tests.log 2>&1
echo "pytest one-GPU (r47) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed|s call" $out/tests.log | tail -8
