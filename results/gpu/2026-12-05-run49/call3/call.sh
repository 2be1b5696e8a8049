#!/bin/bash
# Session 53, one GPU; carry `.commit .devso/padstamps16.so.gz .devso/pad16.so.gz .devso/pad17.so.gz
# .devso/pad15.so.gz`.
# Builds: `pad16` / `padstamps16` from branch `round73` (round 73: the routing's ids kept in shared
# memory beside the masks; a warp's first item's source loaded before the masks are built);
# `pad17` from the same branch with round 74 (the partials combine's receive: two chunks a lane a
# pass, all their loads before the first tag check); `pad15`: main's kernels (round 72).
# 1. The padded dispatch's stamps (run 49 call 2, padstamps15, at 1 token: masks 0.8, copied 3.1,
#    rows 4.0, exit 5.2 us). Predicted: copied ~1.2 at 1 token (the row loaded during the masks, the
#    ids from shared memory), exit ~3.5.
# 2. The padded tests on pad16 and pad17 (world size 1; EP2 with both ranks on the GPU); their second round
#    now passes x and x_scale 4 bytes off a 16-byte boundary (the kernels' vector paths must not
#    take them).
# 3. The decode bench (SELF_SEND=1) pad15, pad16, pad17, pad15. Predicted: dispatch_padded ~1.5 us
#    less at 1 token (pad15: 7.6), ~1 less at 32 and 128 (every warp's single item preloaded);
#    pad17's combine_padded ~0.5-1 us less at 128 tokens (its receive slices of 56 chunks: one pass,
#    not two), the same at 1 and 32 (slices of 32 chunks).
set -u
source scripts/gpu_call.sh padstamps16
step "padded timeline" timeline_padded.log 120 python3 scripts/kernel_timeline.py --config deepseek_decode \
  --tokens 1 32 128 --iters 100 --world-size 1 --padded --out "$raw/timeline_padded.json"
grep -E "tokens per rank|dispatch" "$raw/timeline_padded.log" | head -30
use_build pad16
step "padded one GPU pad16" tests_padded_single.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
step "padded shared EP2 pad16" tests_padded_shared.log 200 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 MOE_TEST_CASES=8 \
  python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k padded
use_build pad17
step "padded one GPU pad17" tests_padded_single17.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
step "padded shared EP2 pad17" tests_padded_shared17.log 200 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 MOE_TEST_CASES=8 \
  python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k padded
decode_bench_ws1 pad15 a
decode_bench_ws1 pad16
decode_bench_ws1 pad17
decode_bench_ws1 pad15 b
