#!/bin/bash
# Session 62 (prepared), one GPU; carry `.commit .devso/pad46.so.gz .devso/pad45.so.gz`.
# Round 90 (branch `round90`, build `pad46`; main's build `pad45`; `round90.patch` here is the
# branch against main): the padded partials send's slices sized by the call's live items (at 1 token
# 28, one pass of chunks a lane, where S = 16 made two), a warp's items' slot words in one load.
# Run 55 call 1: the 16 sending warps each ran ~830 instructions, two passes of ~300 among them.
# Where .devso lacks pad46: `git apply results/gpu/2026-12-07-run56/call1/round90.patch`,
# `scripts/build_device_extension.sh pad46`, `git checkout csrc`, `gzip -kf .devso/pad46.so`.
# Predicted: combine_padded ~0.5 us less at 1-32 tokens, 128 within 0.2 (S unchanged there).
# The padded tests on pad46 (world size 1, EP2 with both ranks on the GPU), then the decode bench
# cold at 1 / 8 / 16 / 32 / 64 / 128 tokens, main before and after.
set -u
source scripts/gpu_call.sh pad46
padded_tests pad46
for b in pad45:a pad46: pad45:b; do
  decode_bench_ws1 "${b%%:*}" "${b#*:}" --num-tokens 1 8 16 32 64 128
done
