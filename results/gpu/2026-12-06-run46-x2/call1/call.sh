#!/bin/bash
# Session 50 (prepared; session 61: build `pad45` (main's kernels: rounds 66-72, 75, 78, 79, 81, 83-86, the padded
# combine's partials by default, the padded dispatch's slot words once a rank, its rows in slices in calls of a
# row per SM or more, in one pass of loads, without counter or fence for this GPU's experts in a whole dispatch,
# less code on its paths, its round by a ticket at entry and its receive on the grid's last threads, a block a row item up to the SMs; the combine send's rows by bulk copies in small calls; the contiguous two-kernel combine send's by a step's bulk copies), TWO GPUs;
# carry `.commit .devso/pad45.so.gz`.
# 1. The padded layout at EP2 on two GPUs (nvlink by the padded kernels; put derived), against the
#    oracle, CUDA graphs too.
# 2. DeepSeek decode at EP2, issue 6's method (200 iterations): the padded ops beside the
#    contiguous ones; the 1-token dispatch target is 10 us (run 43: 11.9 contiguous).
set -u
source scripts/gpu_call.sh pad45
step "padded EP2" tests_padded.log 200 python3 -m pytest -q -m gpu -rA -x tests/gpu/test_nvshmem.py -k padded
step "decode bench EP2" bench_decode.log 200 python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem \
  --out "$raw/decode.json"
tail -14 "$raw/bench_decode.log"
# Session 54: the decode targets on it, the padded phases beside the contiguous ones.
python3 scripts/check_targets.py "$raw/decode.json" --json "$raw/targets_decode.json" | grep -E "decode|checks met"
step "decode bench EP2 per-row flags" bench_decode_flags.log 200 env MOE_BACKEND_NVSHMEM_PADDED_PARTIALS=0 \
  python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem --out "$raw/decode_flags.json"
tail -14 "$raw/bench_decode_flags.log"
# Session 56: the same with the inputs warm (`--warm-inputs`: the padded combine's filled rows
# touched in place, as the expert GEMM leaves them; run 51 call 3 at world size 1: its 128-token
# combine 16.5 us cold, 11.2 warm, while the contiguous combine's y is warm either way).
step "decode bench EP2 warm" bench_decode_warm.log 200 python3 -m moe_backend.cli bench --config deepseek_decode \
  --backend nvshmem --warm-inputs --out "$raw/decode_warm.json"
tail -14 "$raw/bench_decode_warm.log"
