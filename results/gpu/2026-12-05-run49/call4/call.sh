#!/bin/bash
# Session 53 (prepared, not run: the session's device time was spent), one GPU; carry
# `.commit .devso/pad15.so.gz` (main's kernels, round 72).
# Main since run 49 call 3: the validation layer copies tensor inputs off a 16-byte boundary
# (`validate.vector_aligned`) and refuses an `out` off one. On pad15:
# 1. The padded tests, whose second round passes x, x_scale and expert_y 4 bytes off a boundary
#    (world size 1; EP2 with both ranks on the GPU, the contract tasks' bad inputs included: 28
#    refused on a GPU, the `out` off a boundary among them). Run 49 call 3 crashed here on pad17
#    (`misaligned address`, a contiguous-path case) before the fix.
# 2. The one-GPU file's first half (MOE_TEST_SHARD=1/2: 340 s in run 48), the contiguous ops on the fix.
set -u
source scripts/gpu_call.sh pad15
padded_tests pad15
step "one GPU shard 1/2" tests_single_shard1.log 360 env MOE_TEST_SHARD=1/2 python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem_single.py
