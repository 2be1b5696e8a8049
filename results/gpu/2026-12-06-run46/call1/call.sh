#!/bin/bash
# Session 49 (prepared), one GPU, build `main48` (main47's kernels, SASS identical by cuobjdump
# except the three two-part (DYN) direct instances); carry `.commit .devso`.
# 1. The compiled paths with `DispatchResult.local_experts()` (run 45 call 4: inductor's
#    searchsorted over `expert_offsets[1:]` was what made the compiled decode step differ):
#    the helper compiled on the GPU against its definition, the compiled decode step on both
#    transports, and examples/decode_step.py (one CUDA graph) at world size 1.
# 2. The whole one-GPU suite on main48 (its last full run predates rounds 63-64's host code).
set -u
source scripts/gpu_call.sh main48
step "local experts compiled" tests_local_experts.log 90 python3 -m pytest -q -m gpu -rA tests/test_compile.py -k cuda
step "compiled decode step" tests_compile.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k compiled_decode_step
step "decode example" decode_example.log 60 env WORLD_SIZE=1 python3 examples/decode_step.py
tail -2 "$raw/decode_example.log"
step "one-GPU suite" tests_single.log 330 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py
