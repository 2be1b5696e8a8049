#!/bin/bash
# Run 34, call 4: scripts/gpu_ab_bench.sh with variants naming carried builds (its new
# MOE_BACKEND_DEVSO=NAME): r47 in place as the base, r46b swapped in, a missing build reported.
set -u
gunzip -f .devso/r47.so.gz .devso/r46b.so.gz
export MOE_BACKEND_DEVSO=r47
AB_BENCH_ARGS="--world-size 1 --num-tokens 1 128" timeout 150 bash scripts/gpu_ab_bench.sh $OUT/ab deepseek_decode \
  MOE_BACKEND_DEVSO=r46b base MOE_BACKEND_DEVSO=missing base
echo "rc $?"
