#!/usr/bin/env bash
# Run 28, call 7: the few-SMs test with its cases sized by `sources`, and the SM-ceiling probe
# without its speed comparison, 4 ranks sharing the one GPU (MOE_TEST_SHARED_GPU=1).
set -u
out=$OUT/call7; mkdir -p $out
export out
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh
export MOE_TEST_SHARED_GPU=1
start=$(date +%s)
MOE_TEST_WORLD=4 MOE_TEST_CASES=6 timeout 150 python3 -m pytest -m gpu tests/gpu/test_nvshmem.py -q -s -rA -k "few_sms or sm_ceilings" > $out/few_ceilings_w4.log 2>&1
echo "few_ceilings_w4 rc=$? in $(( $(date +%s) - start )) s" | tee -a $out/summary.txt
tail -4 $out/few_ceilings_w4.log
