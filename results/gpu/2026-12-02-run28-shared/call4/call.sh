#!/usr/bin/env bash
# Run 28, call 4: more of the file with 4 ranks sharing the one GPU
# (MOE_TEST_SHARED_GPU=1; results only, no timing).
set -u
out=$OUT/call4; mkdir -p $out
export out
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh
export MOE_TEST_SHARED_GPU=1
run() {  # name, limit, world, cases, -k expression
  local start=$(date +%s)
  MOE_TEST_WORLD=$3 MOE_TEST_CASES=$4 timeout $2 python3 -m pytest -m gpu tests/gpu/test_nvshmem.py -q -s -rA -k "$5" > $out/$1.log 2>&1
  echo "$1 rc=$? in $(( $(date +%s) - start )) s" | tee -a $out/summary.txt
  tail -4 $out/$1.log
}


run few_w4 300 4 6 "few_sms or contract_tasks or timeout"
