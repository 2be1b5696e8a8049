#!/bin/bash
# Prepared in run 44 (that session had no device time left) for the next lease, one GPU or two:
# round 61, a send-stream arena's split receive on as few blocks as its tokens fill (main's build
# `main44`: `scripts/build_device_extension.sh main44`, gzip it; carry `.commit .devso`).
# 1. The grids test (every arena's grids by the profiler, round 61's split receive among them),
#    the one-GPU contract variants with the arena's tokens' grids (token-grids, with SELF_SEND too)
#    and the send-stream contract suite at EP2 (two GPUs, or both ranks on the one).
# 2. The sweep's overlap rows at 1-128 tokens (send, a 2048^3 matmul of the dispatch's length,
#    receive), the default against COMPACT_RECV=0 (round 50's grids, as in run 43), alternately
#    twice, at the machine's world size (2 where two GPUs are lent), and COPY_PIECES=1 (a warp per
#    token: 16 tokens' receive on 1-2 blocks). Measured at world size 1 with ITEM_GRIDS=0 in run 37
#    (call 2): 1 / 4 tokens 1.15-1.16 / 1.20 -> 1.07 / 1.06x, 16-128 tokens unchanged. Predicted at
#    EP2: 1 / 4 tokens 1.15 / 1.18 -> <= 1.10x; COPY_PIECES=1 lower at 16 tokens (1.21x).
set -u
source scripts/gpu_call.sh main44
WS=$(nvidia-smi -L | wc -l); [ "$WS" -gt 2 ] && WS=2
step "grids tests" tests_grids.log 200 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k "grids_follow or token-grids"
shared=(); [ "$WS" = 1 ] && shared=(MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2)  # both ranks on the one GPU
step "send-stream tests" tests_send_stream.log 200 env "${shared[@]}" python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem.py -k "send_stream"
step "ab overlap (world size $WS)" ab_overlap.log 420 env AB_BENCH_ARGS="--world-size $WS --num-tokens 1 4 16 64 128" \
  bash scripts/gpu_ab_bench.sh $raw/ab_overlap deepseek_sweep \
  base ${N}_COMPACT_RECV=0 ${N}_COPY_PIECES=1 base ${N}_COMPACT_RECV=0 ${N}_COPY_PIECES=1
cat $raw/ab_overlap/ab.txt
