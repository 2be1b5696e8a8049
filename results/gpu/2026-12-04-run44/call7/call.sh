#!/bin/bash
# Prepared in run 44 for `nvidia-h200-x2`, after results/gpu/2026-12-04-run43-x2/call4 (the records)
# and before its call5: the EP2 A/Bs of run 44's rounds, main's build `main47` (carry `.commit .devso`),
# each alternately twice.
# 1. Round 62 (a send-stream arena's split dispatch on 4 SMs where its rows fit): the sweep's
#    overlap rows, the default against OVERLAP_SMS=132 (round 61). Predicted: 16 tokens 1.21 ->
#    ~1.08x; 1-4 tokens <= 1.10x either way.
# 2. Round 64 (TWO_PART_RECV=1), alone and with the send on the 4 free SMs (OVERLAP_SMS=4; session
#    47: its switch was stuck off before main47): the same rows at 32-128 tokens. Predicted (session
#    47, from run 45's world-size-1 timeline): 64 tokens 1.24 -> no gain alone, ~1.10-1.15x with
#    OVERLAP_SMS=4; 128 tokens 1.40 -> ~1.24-1.3x.
# 3. Round 63 (PUT_TAGGED=1): the sweep's put and nvlink rows at 1-32 tokens. Predicted: put's
#    16-token combine 14.9 -> ~12.1-13.4 us (1.08-1.19x nvlink's).
set -u
# Session 61: main's build is `pad45` (`scripts/build_device_extension.sh pad45`, gzip it; carry
# `.commit .devso/pad45.so.gz`, not the whole .devso: it outgrew the carry limit).
source scripts/gpu_call.sh pad45
step "ab overlap (rounds 62, 64)" ab_overlap.log 300 env AB_BENCH_ARGS="--world-size 2 --num-tokens 1 4 16 32 64 128" \
  bash scripts/gpu_ab_bench.sh $raw/ab_overlap deepseek_sweep \
  base ${N}_OVERLAP_SMS=132 ${N}_TWO_PART_RECV=1 ${N}_TWO_PART_RECV=1,${N}_OVERLAP_SMS=4 \
  base ${N}_OVERLAP_SMS=132 ${N}_TWO_PART_RECV=1 ${N}_TWO_PART_RECV=1,${N}_OVERLAP_SMS=4
cut -c1-45,61-200 $raw/ab_overlap/ab.txt
step "ab put tagged (round 63)" ab_put_tagged.log 200 env AB_BENCH_ARGS="--backend all --world-size 2 --num-tokens 1 4 16 32" \
  bash scripts/gpu_ab_bench.sh $raw/ab_put_tagged deepseek_sweep base ${N}_PUT_TAGGED=1 base ${N}_PUT_TAGGED=1
cut -c1-45,61-200 $raw/ab_put_tagged/ab.txt
