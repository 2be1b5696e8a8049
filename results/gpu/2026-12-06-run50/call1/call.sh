#!/bin/bash
# Session 54, one GPU: queue entries 1m, 1n and 1l (run 49 calls 6, 7 and 5, prepared in session 53)
# in one call, so a scarce machine serves them all. Carry `.commit .devso/pad15.so.gz
# .devso/pad18.so.gz .devso/fused19.so.gz .devso/padstamps15.so.gz`.
# Builds: `pad15` main's kernels (round 72); `pad18` branch `round75` (less code on the padded
# dispatch's paths: 2,920 -> 1,248 SASS instructions); `fused19` branch `round76` (the fused
# dispatch's nk row loops rolled: the decode instance 4,488 -> 3,264); `padstamps15` pad15 with stamps.
# 1. The decode bench (SELF_SEND=1) pad15, pad18, fused19, pad15. Predicted: pad18's dispatch_padded
#    and fused19's dispatch (1 and 32 tokens) 0.2-0.5 us below pad15's.
# 2. Their tests: the padded tests on pad18; the contract variants that run the fused dispatch's
#    instances on fused19.
# 3. Round 73's cold-input reading (1l): the padded timeline with --warm-inputs, then the decode
#    bench on pad15 warm beside the cold runs of step 1. Predicted: the 1-token copy issued ~1.5 us
#    from the entry (3.0 cold), every dispatch ~1-2 us less warm.
set -u
source scripts/gpu_call.sh pad15
decode_bench_ws1 pad15 a
decode_bench_ws1 pad18
decode_bench_ws1 fused19
decode_bench_ws1 pad15 b
use_build pad18
padded_tests pad18
use_build fused19
step "fused contract fused19" tests_fused.log 200 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k "contract_on_one_gpu and (self-send] or tagged-rows or general-fused or lean-not-small or split-dispatch or overlap])"
use_build padstamps15
step "padded timeline warm" timeline_padded_warm.log 90 python3 scripts/kernel_timeline.py --config deepseek_decode \
  --tokens 1 32 128 --iters 100 --world-size 1 --padded --warm-inputs --out "$raw/timeline_padded_warm.json"
grep -E "tokens per rank|dispatch" "$raw/timeline_padded_warm.log" | head -30
use_build pad15
step "decode bench ws1 warm" bench_warm.log 60 env ${N}_SELF_SEND=1 python3 -m moe_backend.cli bench \
  --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 --warm-inputs --out "$raw/decode_ws1_warm.json"
grep -E "^nvshmem|^dense" "$raw/bench_warm.log"
