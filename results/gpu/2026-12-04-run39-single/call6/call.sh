#!/bin/bash
# Run 39, call 6 (`bycall`, main's kernels and host code; main 5014581 adds Python only): the
# arena's check of the MOE_BACKEND_NVSHMEM_* variables under the GPU tests that set the most of
# them: the one-GPU contract under SELF_SEND with the copy-engine send and overlap switches, the
# slots, the grids, the task contract; at EP2 on the shared GPU the copy-engine contract suite
# (chunks, decay, streams), the copy variants (pieces, PDL) and the wide receive.
set -u
out=$OUT; mkdir -p $out
gunzip -f .devso/bycall.so.gz
export MOE_BACKEND_DEVSO=bycall MOE_BACKEND_COMMIT=$(cat .commit)
T0=$(date +%s)
source scripts/gpu_env.sh > /dev/null 2>&1
F=tests/gpu/test_nvshmem_single.py
timeout 200 python3 -m pytest -q -m gpu -rA "$F::test_contract_on_one_gpu[self-send-copy-engine]" \
  "$F::test_self_send_goes_through_the_slots" "$F::test_grids_follow_the_largest_call" "$F::test_contract_tasks_on_one_gpu" \
  > $out/tests.log 2>&1
echo "pytest one-GPU rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -8
MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_nvshmem.py -rA \
  -k "copy_engine or copy_variants or test_whole_combine_receive_takes_a_warp_per_item" > $out/tests_ep2.log 2>&1
echo "pytest EP2 shared rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests_ep2.log | tail -6
