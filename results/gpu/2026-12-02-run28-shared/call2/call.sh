#!/usr/bin/env bash
# Run 28, call 2: the fixed contract-tasks test with ranks sharing the one GPU, then the contract
# suite with 4 and 8 ranks on it (MOE_TEST_SHARED_GPU=1; results only, no timing).
set -u
out=$OUT/call2; mkdir -p $out
export out
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh
export MOE_TEST_SHARED_GPU=1
run() {  # name, limit, world, cases, -k expression
  local start=$(date +%s)
  MOE_TEST_WORLD=$3 MOE_TEST_CASES=$4 timeout $2 python3 -m pytest -m gpu tests/gpu/test_nvshmem.py -q -s -rA -k "$5" > $out/$1.log 2>&1
  echo "$1 rc=$? in $(( $(date +%s) - start )) s" | tee -a $out/summary.txt
  tail -4 $out/$1.log
}
run tasks_w2 150 2 24 "contract_tasks"
run contract_w4 200 4 12 "both_transports"
run contract_w8 200 8 6 "both_transports"
