#!/bin/bash
# Session 61: run as run 54 call 5 (prepared in session 59 as run 53 call 4, moved here), half 1;
# call 6 runs it with SHARD=2/2.
# Session 59 (prepared, not run: the device time left could not start a machine), one GPU; carry
# `.commit .devso/pad39.so.gz` (main's kernels after round 86).
# The one-GPU test file's half 1 of 2 (MOE_TEST_SHARD=1/2, interleaved; ~6 min), as after each
# merge; half 2 is the same with MOE_TEST_SHARD=2/2 (a call of its own: each half takes ~6 min).
# Session 62: BUILD (default pad39, as run) names another carried build for later runs of the file.
set -u
source scripts/gpu_call.sh ${BUILD:-pad39}
step "one GPU shard ${SHARD:-1/2}" tests_single_shard.log 560 env MOE_TEST_SHARD=${SHARD:-1/2} python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem_single.py
grep -E "passed|failed|error" "$raw/tests_single_shard.log" | tail -3
