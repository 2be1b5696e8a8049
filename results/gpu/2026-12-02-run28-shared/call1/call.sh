#!/usr/bin/env bash
# Run 28, call 1: the EP2 test file with both ranks on the one lent GPU (MOE_TEST_SHARED_GPU=1).
set -u
out=$OUT/call1; mkdir -p $out
export out
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh
git rev-parse HEAD > $out/commit.txt 2>/dev/null || cp .commit $out/commit.txt
nvidia-smi -L > $out/smi.txt 2>&1
export MOE_TEST_SHARED_GPU=1
start=$(date +%s)
timeout 200 python3 -m pytest -m gpu tests/gpu/test_nvshmem.py -q -s -rA -k "both_transports" > $out/shared_smoke.log 2>&1
echo "smoke rc=$? in $(( $(date +%s) - start )) s" | tee -a $out/summary.txt
if grep -q " passed" $out/shared_smoke.log && ! grep -q " failed" $out/shared_smoke.log; then
  start=$(date +%s)
  timeout 330 python3 -m pytest -m gpu tests/gpu/test_nvshmem.py -q -s -rA -k "not both_transports" --durations=0 > $out/shared_rest.log 2>&1
  echo "rest rc=$? in $(( $(date +%s) - start )) s" | tee -a $out/summary.txt
fi
tail -30 $out/shared_smoke.log
tail -40 $out/shared_rest.log 2>/dev/null
