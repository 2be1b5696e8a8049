#!/usr/bin/env bash
# Run 28, call 6: more of the file with 8 ranks sharing the one GPU
# (MOE_TEST_SHARED_GPU=1; results only, no timing).
set -u
out=$OUT/call6; mkdir -p $out
export out
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh
export MOE_TEST_SHARED_GPU=1
run() {  # name, limit, world, cases, -k expression
  local start=$(date +%s)
  MOE_TEST_WORLD=$3 MOE_TEST_CASES=$4 timeout $2 python3 -m pytest -m gpu tests/gpu/test_nvshmem.py -q -s -rA -k "$5" > $out/$1.log 2>&1
  echo "$1 rc=$? in $(( $(date +%s) - start )) s" | tee -a $out/summary.txt
  tail -4 $out/$1.log
}


run more_w8 400 8 4 "copy_engine or rounds or contract_tasks or tagged_rows"
