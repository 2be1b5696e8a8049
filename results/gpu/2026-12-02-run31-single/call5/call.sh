#!/bin/bash
# Run 31, call 5: what one dependent step costs on the H200 (scripts/step_costs.py: the timer
# loop, L2 and memory load chains, acquire loads, stores with system / GPU fences, release
# stores and adds, atomics, block barriers, an 8 KB table portion's stores and announce; at 1,
# 32 and one block per SM), then its GPU test.
set -u
out=$OUT; mkdir -p $out /tmp/w
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"
T0=$(date +%s)
MOE_BACKEND_COMMIT=$(cat .commit) timeout 120 python3 scripts/step_costs.py --out $out/step_costs.json 2>&1 | tee $out/step_costs.txt
echo "probe done at $(( $(date +%s) - T0 )) s"
MOE_BACKEND_COMMIT=$(cat .commit) timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem_single.py -rA -k "step_costs" > $out/tests.log 2>&1
echo "pytest rc $?"; grep -E "PASSED|FAILED|ERROR|passed|failed|assert" $out/tests.log | tail -5
echo "all done at $(( $(date +%s) - T0 )) s"
