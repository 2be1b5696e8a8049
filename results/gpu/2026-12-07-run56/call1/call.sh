#!/bin/bash
# Session 62 (prepared), one GPU; carry `.commit .devso/pad46.so.gz .devso/pad47.so.gz .devso/pad45.so.gz`.
# Round 90 (build `pad46`, `round90.patch` here against main): the padded partials send's slices
# sized by the call's live items (at 1 token 28, one pass of chunks a lane, where S = 16 made two),
# a warp's items' slot words in one load. Round 91 (build `pad47`, `rounds90-91.patch`): on round
# 90, the send's bulk copies only where a slice is more than one pass (in one pass the register
# path's loads are one latency too, without the copies' issue and barrier).
# Run 55 call 1: the 16 sending warps each ran ~830 instructions, two passes of ~300 among them, and
# ~230 before the bulk copies' issue.
# Predicted: combine_padded ~0.5 us less at 1-32 tokens for pad46, another 0.2-0.5 for pad47;
# 128 within 0.2 (S and the path unchanged there).
# Where .devso lacks a build: `git apply` its patch, `scripts/build_device_extension.sh NAME`,
# `git checkout csrc`, `gzip -kf .devso/NAME.so`.
# The padded tests on each (world size 1, EP2 with both ranks on the GPU), then the decode bench
# cold at 1 / 8 / 16 / 32 / 64 / 128 tokens, main before and after.
set -u
source scripts/gpu_call.sh pad46
padded_tests pad46
use_build pad47
padded_tests pad47
decode_ab_ws1 "pad45:a pad46: pad47: pad45:b" --num-tokens 1 8 16 32 64 128
