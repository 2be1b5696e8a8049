#!/bin/bash
# Run 34, call 3: r47 (the reordered Params, 91d64a9; main 657552e changes only comments) at EP2 with
# both ranks on the one GPU, both transports: the multi-rank paths of the new layout.
set -u
out=$OUT; mkdir -p $out
gunzip -f .devso/r47.so.gz
MOE_BACKEND_DEVSO=r47 source scripts/gpu_env.sh > /tmp/env.log 2>&1
echo "commit $(cat .commit) devso_loaded=${devso_loaded:-?}"
T0=$(date +%s)
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "both_transports" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -4
