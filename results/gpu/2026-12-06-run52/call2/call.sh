#!/bin/bash
# Session 57, one GPU; carry `.commit .devso/pad28.so.gz .devso/pad30.so.gz`.
# Builds: `pad30` from branch `round84` at its second form (call 1's, and a receive launched beside
# a step-bulk send asks for the largest shared-memory carveout, so the send's ~142 KB blocks fit
# beside it: call 1's EP2 tagged-partials case timed out when the receive took the SMs first);
# `pad28` main's kernels.
# 1. EP2 with both ranks on the GPU first (call 1's failure), then the one-GPU variants.
# 2. The decode bench (SELF_SEND=1) cold at 1, 16, 32, 64 and 128 tokens: pad28, pad30, pad30 with
#    STEP_BULK=0, pad30, pad28. Predicted: call 1's pad29 (32 tokens 1.1-1.5 us less, 128 whole
#    0.3 more, 128 split 4.8 less); the carveout may move the receive by a few tenths either way.
set -u
source scripts/gpu_call.sh pad30
g=tests/gpu/test_nvshmem.py
step "contract shared EP2 pad30" tests_shared_pad30.log 300 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 \
  MOE_TEST_CASES=8 python3 -m pytest -q -m gpu -rA "$g::test_contract_suite_tagged_partials" \
  "$g::test_contract_suite_register_send_rows" "$g::test_contract_suite_both_transports" \
  "$g::test_contract_suite_whole_combine_forced"
grep -q "5 passed" "$raw/tests_shared_pad30.log" || { echo "pad30 EP2 tests failed: no bench"; exit 0; }
f=tests/gpu/test_nvshmem_single.py::test_contract_on_one_gpu
step "contract one GPU pad30" tests_single_pad30.log 150 python3 -m pytest -q -m gpu -rA \
  "$f[side-combine]" "$f[pdl-combine]" "$f[tagged-partials]" "$f[self-send]" "$f[register-send-rows]"
for b in pad28:a: pad30:a: pad30:regs:0 pad30:b: pad28:b:; do
  IFS=: read -r build tag sw <<< "$b"
  use_build "$build"
  step "decode bench ws1 $build$tag" "bench_$build$tag.log" 60 env ${N}_SELF_SEND=1 ${sw:+${N}_COMBINE_STEP_BULK=$sw} \
    python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 \
    --num-tokens 1 16 32 64 128 --out "$raw/decode_ws1_$build$tag.json"
  grep -E "^nvshmem" "$raw/bench_$build$tag.log"
done
