#!/bin/bash
# Session 57, one GPU; carry `.commit .devso/pad28.so.gz .devso/pad29.so.gz`.
# Builds: `pad29` from branch `round84` (the two-kernel combine send's small calls: a step's rows,
# 1 KB each, by one bulk copy a row into the warp's 8 KB of shared memory, one wait; every call for
# now, STEP_BULK_MAX_TOKENS unbounded, so the A/B shows where it wins; MOE_BACKEND_NVSHMEM_COMBINE_STEP_BULK=0
# keeps the registers); `pad28` main's kernels.
# 1. Tests on pad29: the one-GPU contract variants that run the two-kernel combine (both loads),
#    then EP2 with both ranks on the GPU (the contract suite, the tagged partials, the register rows).
# 2. The decode bench (SELF_SEND=1) cold: pad28, pad29, pad29 with STEP_BULK=0, pad29, pad28.
#    Predicted: combine 0.3-0.6 us less at 1 and 32 tokens (one load latency a step, not two);
#    128 tokens unknown (round 83's padded form lost 1.0 us there with every warp sending).
set -u
source scripts/gpu_call.sh pad29
f=tests/gpu/test_nvshmem_single.py::test_contract_on_one_gpu
step "contract one GPU pad29" tests_single_pad29.log 240 python3 -m pytest -q -m gpu -rA \
  "$f[overlap]" "$f[no-overlap]" "$f[side-combine]" "$f[pdl-combine]" "$f[self-send]" "$f[tagged-partials]" \
  "$f[untagged-partials]" "$f[mixed-partials]" "$f[register-send-rows]" "$f[token-grids-self-send]"
grep -q "10 passed" "$raw/tests_single_pad29.log" || { echo "pad29 tests failed: no bench"; exit 0; }
g=tests/gpu/test_nvshmem.py
step "contract shared EP2 pad29" tests_shared_pad29.log 200 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 \
  MOE_TEST_CASES=8 python3 -m pytest -q -m gpu -rA "$g::test_contract_suite_both_transports" \
  "$g::test_contract_suite_tagged_partials" "$g::test_contract_suite_register_send_rows"
decode_bench_ws1 pad28 a
decode_bench_ws1 pad29 a
use_build pad29
step "decode bench ws1 pad29 STEP_BULK=0" bench_pad29_regs.log 60 env ${N}_SELF_SEND=1 ${N}_COMBINE_STEP_BULK=0 \
  python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 \
  --out "$raw/decode_ws1_pad29_regs.json"
grep -E "^nvshmem" "$raw/bench_pad29_regs.log"
decode_bench_ws1 pad29 b
decode_bench_ws1 pad28 b
