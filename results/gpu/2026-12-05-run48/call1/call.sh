#!/bin/bash
# Session 52, one GPU, build `pad9` (main's kernels with round 68's two tidies: the dispatch writes a
# token's slot words at a rank from its first k there alone, the partials' combine launched without
# the counts scan's shared memory), `pad8` beside it as the same machine's baseline; carry
# `.commit .devso/pad9.so.gz .devso/pad8.so.gz`.
# 1. The one-GPU padded tests, with and without partials (pad9).
# 2. The decode bench at world size 1 (SELF_SEND=1): pad9 with and without partials, pad8 with.
#    Predicted: pad9's padded dispatch at or below pad8's (~10 / ~11.7 / ~14.4 us at 1 / 32 / 128
#    tokens on an H100), the combines unchanged.
# 3. The one-GPU file's first half (MOE_TEST_SHARD=1/2), with its slowest tests listed.
set -u
source scripts/gpu_call.sh pad9
step "padded one GPU" tests_padded_single.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
bench() {  # BUILD PARTIALS
  MOE_BACKEND_DEVSO=$1 source scripts/gpu_devso.sh
  step "decode bench ws1 $1 partials=$2" bench_$1_partials$2.log 60 env ${N}_SELF_SEND=1 ${N}_PADDED_PARTIALS=$2 \
    python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --world-size 1 --iters 100 \
    --out "$raw/decode_ws1_$1_partials$2.json"
  grep -E "^nvshmem" "$raw/bench_$1_partials$2.log"
}
bench pad9 1
bench pad8 1
bench pad9 0
MOE_BACKEND_DEVSO=pad9 source scripts/gpu_devso.sh
left=$(( 585 - ($(date +%s) - T0) ))
step "one-GPU suite part 1/2" tests_single_1.log $left env MOE_TEST_SHARD=1/2 python3 -m pytest -q -m gpu -rA \
  -o console_output_style=times --durations=12 tests/gpu/test_nvshmem_single.py
grep -E "passed|failed|s call" "$raw/tests_single_1.log" | head -16
