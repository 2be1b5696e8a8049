#!/bin/bash
# Session 50 (call 3), one GPU, build `pad3` (pad1 with relaxed count words for experts without rows, no counter for
# one-row experts, and the combine send a warp per filled slot, found by a scan of the counts); carry `.commit .devso/pad3.so.gz`.
# 1. The padded layout at world size 1 (both transports; nvlink by the padded kernels) and at EP2
#    with both ranks on the one GPU (MOE_TEST_SHARED_GPU=1), against the oracle, CUDA graphs too.
# 2. DeepSeek decode at world size 1: the padded ops beside the contiguous ones (one bench run).
set -u
source scripts/gpu_call.sh pad3
step "padded one GPU" tests_padded_single.log 200 python3 -m pytest -q -m gpu -rA -x tests/gpu/test_nvshmem_single.py -k padded
step "padded shared EP2" tests_padded_shared.log 200 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 MOE_TEST_CASES=8 \
  python3 -m pytest -q -m gpu -rA -x tests/gpu/test_nvshmem.py -k padded
step "decode bench ws1" bench_decode_ws1.log 150 python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem \
  --world-size 1 --iters 100 --out "$raw/decode_ws1.json"
grep -E "padded|dispatch " "$raw/bench_decode_ws1.log" | head; tail -25 "$raw/bench_decode_ws1.log"
grep -E "Error|error|assert" "$raw"/tests_padded_*.log | head -20
