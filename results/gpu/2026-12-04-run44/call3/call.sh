#!/bin/bash
# Run 44, call 3 on `nvidia-h200` (one GPU), main's build `main44`: what the overlap rows at 16-128
# tokens give with the communication's kernels sized for few SMs (round 21: the matmul between the
# halves leaves 4 of 132 SMs free; at 16 tokens `--sms 4` met 1.10x then). The sweep's overlap
# rows at world size 1, all SMs against `--sms 4 8 16`, by default and with SELF_SEND=1 (the send
# ships this rank's tokens to itself over the cross-rank path, as at EP2), alternately twice.
set -u
source scripts/gpu_call.sh main44
step "ab overlap, few SMs" ab_sms.log 500 env AB_BENCH_ARGS="--world-size 1 --num-tokens 16 32 64 128 --sms 4 8 16" \
  bash scripts/gpu_ab_bench.sh $raw/ab_sms deepseek_sweep base ${N}_SELF_SEND=1 base ${N}_SELF_SEND=1
cat $raw/ab_sms/ab.txt
