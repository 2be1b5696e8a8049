#!/bin/bash
# Session 57, one GPU; carry `.commit .devso/pad28.so.gz .devso/pad31.so.gz`.
# Builds: `pad31` from branch `round84` at its third form (call 2's, the step-bulk send only where
# the receive is not launched by PDL behind it: the whole combine's larger calls keep the registers
# and the driver's carveout, as main); `pad28` main's kernels.
# 1. EP2 with both ranks on the GPU (tagged partials, the whole combine forced both ways), then the
#    one-GPU side-stream, PDL and register-rows variants.
# 2. The decode bench (SELF_SEND=1) cold at 1, 16, 32, 64, 128 tokens: pad28, pad31, pad28.
#    Predicted: call 2's pad30 at 1-32 tokens (16 / 32 tokens 1.3-1.5 us less), main's at 64 / 128
#    (the PDL calls); the split combine as pad30 (2-5 us less from 16 tokens).
set -u
source scripts/gpu_call.sh pad31
g=tests/gpu/test_nvshmem.py
step "contract shared EP2 pad31" tests_shared_pad31.log 240 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 \
  MOE_TEST_CASES=8 python3 -m pytest -q -m gpu -rA "$g::test_contract_suite_tagged_partials" \
  "$g::test_contract_suite_whole_combine_forced"
grep -q "3 passed" "$raw/tests_shared_pad31.log" || { echo "pad31 EP2 tests failed: no bench"; exit 0; }
f=tests/gpu/test_nvshmem_single.py::test_contract_on_one_gpu
step "contract one GPU pad31" tests_single_pad31.log 120 python3 -m pytest -q -m gpu -rA \
  "$f[side-combine]" "$f[pdl-combine]" "$f[register-send-rows]"
for b in pad28:a pad31: pad28:b; do
  IFS=: read -r build tag <<< "$b"
  use_build "$build"
  step "decode bench ws1 $build$tag" "bench_$build$tag.log" 60 env ${N}_SELF_SEND=1 \
    python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 \
    --num-tokens 1 16 32 64 128 --out "$raw/decode_ws1_$build$tag.json"
  grep -E "^nvshmem" "$raw/bench_$build$tag.log"
done
