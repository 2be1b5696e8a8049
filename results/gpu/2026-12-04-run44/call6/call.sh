#!/bin/bash
# Prepared in run 44 (its device time spent) for the next lease of any GPU: main's build `main46`
# (`scripts/build_device_extension.sh main46`, gzip it; carry `.commit .devso`).
# 1. Tests with both EP2 ranks on the GPU (two GPUs: on both): round 63 (PUT_TAGGED=1, put's
#    combine partials round-tagged, staged and put with no signal) beside the nvlink tagged-partials
#    suite; the send-stream suite by default, with round 62 forced and with round 64's two-part
#    receive (TWO_PART_RECV=1: 4 blocks with the send, the rest launched by dispatch_recv).
# 2. The grids test as extended after run 44's call 5 (an arena of 32 KB rows: round 62's bound),
#    and a decode step under torch.compile on both transports (session 46: the Communicator's calls
#    run eagerly there; bit-exact against the oracle).
# 3. Round 64 at world size 1: the sweep's overlap rows at 16-128 tokens, the default against
#    TWO_PART_RECV=1, with and without SELF_SEND=1, alternately twice. Predicted: 64 tokens
#    32.0-33.4 -> ~29-30 us (1.23-1.29x -> ~1.13-1.15x), 128 tokens 34-38 -> ~32-34 (~1.24-1.3x),
#    16-32 tokens unchanged or worse (16 tokens has round 62's 4 SMs by default; TWO_PART_RECV
#    takes precedence).
set -u
source scripts/gpu_call.sh main46
WS=$(nvidia-smi -L | wc -l)
shared=(); [ "$WS" = 1 ] && shared=(MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2)  # both ranks on the one GPU
step "tagged and send-stream tests" tests_ep2.log 270 env "${shared[@]}" python3 -m pytest -q -m gpu -rA \
  tests/gpu/test_nvshmem.py -k "tagged_partials or send_stream"
step "grids and compile tests" tests_grids.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k "grids_follow or compiled_decode_step"
S=${N}_SELF_SEND=1
step "ab two-part receive" ab_two_part.log 170 env AB_BENCH_ARGS="--world-size 1 --num-tokens 16 32 64 128" \
  bash scripts/gpu_ab_bench.sh $raw/ab_two_part deepseek_sweep \
  base ${N}_TWO_PART_RECV=1 $S ${N}_TWO_PART_RECV=1,$S base ${N}_TWO_PART_RECV=1 $S ${N}_TWO_PART_RECV=1,$S
cut -c1-45,61-200 $raw/ab_two_part/ab.txt
