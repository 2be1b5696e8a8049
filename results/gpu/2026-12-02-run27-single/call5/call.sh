#!/bin/bash
# Device call 5 (run 27, 0bddad6; its default paths are 10eb614's): every other one-GPU test.
set -u
out=$OUT; mkdir -p $out /tmp/w
MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh > /tmp/w/env.log 2>&1
echo "commit $(cat .commit)"
T0=$(date +%s)
timeout 560 python3 -m pytest -v -m gpu tests/gpu/test_nvshmem_single.py -k "not tagged and not self" > $out/tests.log 2>&1
grep -E "passed|failed|PASSED|FAILED|Error" $out/tests.log | tail -22
echo "all done at $(( $(date +%s) - T0 )) s"
# Call 6 (same build, warm): the two variants the -k above left out ("untagged" contains "tagged"):
#   timeout 200 python3 -m pytest -v -m gpu "tests/gpu/test_nvshmem_single.py::test_contract_on_one_gpu[untagged]" \
#     "tests/gpu/test_nvshmem_single.py::test_rounds_and_graphs_on_one_gpu[untagged]" > $OUT/tests_untagged.log
