#!/bin/bash
# Run 44, call 5 on `nvidia-h200` (one GPU): round 62 as the default (build `r62b`: main with round
# 62's rule, host code only): a send-stream arena's split dispatch on 4 SMs where the arena's
# expected rows fit 4 x 512 KB (the sweep's bf16 arenas: 1-16 tokens a rank), else round 61.
# 1. The grids tests (round 62's rule traced: 4 KB rows on 4 SMs, 32 KB rows not) and the
#    send-stream contract suite at EP2 with both ranks on the GPU (default, OVERLAP_SMS=4).
# 2. The sweep's overlap rows at world size 1, 1-128 tokens: the default against OVERLAP_SMS=132
#    (round 61's grids), each also with SELF_SEND=1, alternately twice.
set -u
source scripts/gpu_call.sh r62b
step "grids tests" tests_grids.log 200 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k "grids_follow"
step "send-stream tests" tests_send_stream.log 120 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 python3 -m pytest -q \
  -m gpu -rA tests/gpu/test_nvshmem.py -k "send_stream"
S=${N}_SELF_SEND=1
step "ab overlap default" ab_default.log 240 env AB_BENCH_ARGS="--world-size 1 --num-tokens 1 4 16 32 64 128" \
  bash scripts/gpu_ab_bench.sh $raw/ab_default deepseek_sweep \
  base ${N}_OVERLAP_SMS=132 $S ${N}_OVERLAP_SMS=132,$S base ${N}_OVERLAP_SMS=132 $S ${N}_OVERLAP_SMS=132,$S
cut -c1-45,61-200 $raw/ab_default/ab.txt
