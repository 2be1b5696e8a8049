#!/bin/bash
# Run 44, call 4 on `nvidia-h200` (one GPU): round 62, a send-stream arena's split dispatch sized for
# MOE_BACKEND_NVSHMEM_OVERLAP_SMS SMs (build `r62`: main + round 62, host code only). Call 3 found
# the 4- and 8-SM arenas' overlap rows at 16 tokens 1.03x (26.9-27.3 us) against 1.21-1.24x (31.7-32.3)
# with every SM, their receive's pieces filling 4 / 8 blocks and their send on 12 / 24.
# 1. The grids tests (round 62's split receive and send grids traced) and the send-stream
#    contract suite at EP2 with both ranks on the GPU, by default and with OVERLAP_SMS=4.
# 2. The sweep's overlap rows at world size 1, 1-128 tokens: the default (round 61) against
#    OVERLAP_SMS=4 and =8, each also with SELF_SEND=1 (the send's rows cross as at EP2),
#    alternately twice.
set -u
source scripts/gpu_call.sh r62
step "grids tests" tests_grids.log 220 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k "grids_follow"
step "send-stream tests" tests_send_stream.log 120 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 python3 -m pytest -q \
  -m gpu -rA tests/gpu/test_nvshmem.py -k "send_stream"
S=${N}_SELF_SEND=1
step "ab overlap sms" ab_osms.log 300 env AB_BENCH_ARGS="--world-size 1 --num-tokens 1 4 16 64 128" \
  bash scripts/gpu_ab_bench.sh $raw/ab_osms deepseek_sweep \
  base ${N}_OVERLAP_SMS=4 ${N}_OVERLAP_SMS=8 $S ${N}_OVERLAP_SMS=4,$S ${N}_OVERLAP_SMS=8,$S \
  base ${N}_OVERLAP_SMS=4 ${N}_OVERLAP_SMS=8 $S ${N}_OVERLAP_SMS=4,$S ${N}_OVERLAP_SMS=8,$S
cut -c1-45,61-200 $raw/ab_osms/ab.txt
