#!/bin/bash
# Session 58, one GPU; carry `.commit .devso/pad38.so.gz .devso/pad32.so.gz`.
# Prepared in session 58, not yet run (too little device time was left to start a machine).
# Build `pad38` first: `git apply results/gpu/2026-12-06-run52/call8/round85.patch` on a branch of
# main (csrc/padded_kernels.cuh only), `scripts/build_device_extension.sh pad38`, gzip it; build
# `pad32` from main itself; run from that branch with both carried.
# Round 85 (the patch, build `pad38`): the padded dispatch's row items go round the blocks
# (warp w of block b takes item b + w * B), so a call of fewer items than warps spreads its rows
# over as many SMs (call 7: the 8-token padded dispatch 8.4-8.6 us against 6.6-6.8 at 1 token and
# 7.0-7.4 at 32; its 64 rows took 4 SMs). The padded tests (world size 1; EP2 with both ranks on
# the GPU), then the decode bench at 1 / 8 / 16 / 32 / 128 tokens, pad32 (main) before and after.
# Predicted: dispatch_padded at 8 and 16 tokens ~7.0 us (16 tokens: 128 rows, 8 SMs before), at 1
# token 0-0.4 us less, 32 and 128 within 0.2.
set -u
source scripts/gpu_call.sh pad38
padded_tests pad38
decode_ab_ws1 "pad32:a pad38: pad32:b" --num-tokens 1 8 16 32 128
