#!/bin/bash
# Session 53 (prepared, not run), one GPU; carry `.commit .devso/fused19.so.gz .devso/pad15.so.gz`.
# Builds: `fused19` from branch `round76` (round 76: the fused dispatch's loops over a token's nk
# expert rows rolled, `store_scale_vec`, `copy_token_piece` and `early_store_piece`: the decode
# instance, dispatch_fused_kernel<1,1,1,1,1>, 4,488 SASS instructions in main's build, 900 of them
# those loops unrolled); `pad15`: main's kernels.
# 1. The contract variants that run the fused dispatch's instances (tagged rows, the lean and
#    general instances, the small one, self-send, split), world size 1, on fused19.
# 2. The decode bench (SELF_SEND=1: the cross-rank path) pad15, fused19, pad15. Predicted:
#    dispatch 0.2-0.5 us less at 1 and 32 tokens (fewer instructions to fetch on each warp's
#    path), the same at 128 (a rolled loop over 8 stores a pass costs little).
set -u
source scripts/gpu_call.sh fused19
step "fused contract fused19" tests_fused.log 300 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py \
  -k "contract_on_one_gpu and (self-send] or tagged-rows or general-fused or lean-not-small or split-dispatch or overlap])"
decode_bench_ws1 pad15 a
decode_bench_ws1 fused19
decode_bench_ws1 pad15 b
