#!/bin/bash
# Run 39, call 1: main ba32564's build (`main53`: round 52 with its review, the whole combine on
# one stream by default). The one-GPU test file's tests that run 38's call 3 did not reach before
# its limit, first half: the contract's partials and grid variants, the few-SM contract, rounds
# and graphs.
set -u
out=$OUT; mkdir -p $out
gunzip -f .devso/main53.so.gz
export MOE_BACKEND_DEVSO=main53 MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
echo "env at $(( $(date +%s) - T0 )) s"
timeout 520 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k "(test_contract_on_one_gpu and (partials or token-grids)) or few_sms or rounds_and_graphs" > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -30
