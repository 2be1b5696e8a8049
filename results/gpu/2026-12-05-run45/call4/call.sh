#!/bin/bash
# Session 49, one GPU, build `main48` (main47 with the two-part receive's claim by one atomicAdd:
# call 2 measured the CAS-loop claim serialising the second part's warps, overlap row 232 us
# against 32 by default at 64 tokens); carry `.commit .devso`.
# 0. The compile diagnosis again (call 2's stopped at start: no __main__ guard for inductor's
#    compile workers, which re-import the script).
# 1. The two-part launch test (call 2's fed the stand-in inputs' poison ids past num_tokens), then
#    round 64's A/B at world size 1, 64 and 128 tokens, default against TWO_PART_RECV=1 (once: the
#    session's budget, after failed starts), the overlap row's timeline with it, and its EP2 send-stream suite on the shared GPU.
set -u
source scripts/gpu_call.sh main48
step "compile diagnosis" diag_compile.log 110 python3 results/gpu/2026-12-05-run45/call2/diag_compile.py
grep -E "searchsorted|case|same|oracle|FAILS|Error" "$raw/diag_compile.log" | head -24
step "two-part test" tests_two_part.log 45 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k two_part_receive_launches
step "ab two-part receive" ab_two_part.log 70 env AB_BENCH_ARGS="--world-size 1 --num-tokens 64 128" \
  bash scripts/gpu_ab_bench.sh $raw/ab_two_part deepseek_sweep base ${N}_TWO_PART_RECV=1
cut -c1-45,61-200 $raw/ab_two_part/ab.txt | grep overlap
step "overlap timeline two-part" overlap_timeline_two_part.log 25 env ${N}_TWO_PART_RECV=1 python3 \
  scripts/profile_timeline.py "$raw/overlap_timeline_two_part" --world-size 1 --overlap 64 128
grep -E "==|stream" "$raw/overlap_timeline_two_part/timeline.txt" | grep -v combine_ | head -16
step "two-part suite EP2 shared" tests_ep2.log 45 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 python3 -m pytest -q \
  -m gpu -rA tests/gpu/test_nvshmem.py -k "send_stream and TWO_PART"
