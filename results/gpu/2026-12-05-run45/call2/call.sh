#!/bin/bash
# Session 47, one H200, build `main47` (main46's kernels, SASS identical by cuobjdump, with the
# host fix: TWO_PART_RECV=1 could not turn round 64 on, env_switch ignored "1" without can_force,
# so run 44 call 6's tests and A/B of it ran the default); carry `.commit .devso`.
# 1. The new test that the two-part receive launches both parts, then round 64's send-stream suite
#    at EP2 with both ranks on the GPU.
# 2. Round 64 at world size 1 for real: the sweep's overlap rows at 64 and 128 tokens, default against
#    TWO_PART_RECV=1, alone and with OVERLAP_SMS=4 (the send's grid on the 4 SMs the matmul leaves
#    too: call 1's timeline had the send's 64 blocks and the receive's full grid holding back the
#    matmul's one wave at 64 tokens), alternately twice; and the overlap row's GPU timeline with it.
# 0. (first, session 48) Why the compiled decode step differs (call 1: still with the stand-in's integer remainder, and
#    the float remainder compiled the same as eager): diag_compile.py.
set -u
source scripts/gpu_call.sh main47
step "compile diagnosis" diag_compile.log 120 python3 results/gpu/2026-12-05-run45/call2/diag_compile.py
grep -E "searchsorted|case|same|oracle|FAILS|Error" "$raw/diag_compile.log" | head -20
step "two-part test" tests_two_part.log 60 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k two_part_receive_launches
step "ab two-part receive" ab_two_part.log 150 env AB_BENCH_ARGS="--world-size 1 --num-tokens 64 128" \
  bash scripts/gpu_ab_bench.sh $raw/ab_two_part deepseek_sweep base ${N}_TWO_PART_RECV=1 ${N}_TWO_PART_RECV=1,${N}_OVERLAP_SMS=4 \
  base ${N}_TWO_PART_RECV=1 ${N}_TWO_PART_RECV=1,${N}_OVERLAP_SMS=4
cut -c1-45,61-200 $raw/ab_two_part/ab.txt | grep overlap
step "overlap timeline two-part" overlap_timeline_two_part.log 40 env ${N}_TWO_PART_RECV=1 python3 \
  scripts/profile_timeline.py "$raw/overlap_timeline_two_part" --world-size 1 --overlap 64 128
grep -E "==|stream" "$raw/overlap_timeline_two_part/timeline.txt" | grep -v combine_ | head -16
step "two-part suite EP2 shared" tests_ep2.log 60 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 python3 -m pytest -q \
  -m gpu -rA tests/gpu/test_nvshmem.py -k "send_stream and TWO_PART"
