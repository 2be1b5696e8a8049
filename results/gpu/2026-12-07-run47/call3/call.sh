#!/bin/bash
# Session 51, one GPU, build `pad7` (round 67: the partials' send as items (source group, token,
# slice) a warp over round-tagged slot words written by the dispatch (no count scan, no lead slot),
# 8 rows' loads in flight before their sums, items spread across blocks first); carry
# `.commit .devso/pad7.so.gz`. Run 47 call 1 (pad6): partials 8.3 / 17.7 / 76.0 us at 1 / 32 / 128
# tokens against 12.8 / 15.8 / 27.0 without.
# 1. The padded tests with and without PADDED_PARTIALS (world size 1; EP2 on the shared GPU).
# 2. The decode bench at world size 1, SELF_SEND=1, by default and with PADDED_PARTIALS=1.
#    Predicted with partials: ~8 / ~10 / ~15 us.
set -u
source scripts/gpu_call.sh pad7
step "padded one GPU" tests_padded_single.log 150 python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem_single.py -k padded
step "padded shared EP2" tests_padded_shared.log 200 env MOE_TEST_SHARED_GPU=1 MOE_TEST_WORLD=2 MOE_TEST_CASES=8 \
  python3 -m pytest -q -m gpu -rA tests/gpu/test_nvshmem.py -k padded
for v in 0 1; do
  step "decode bench ws1 partials=$v" bench_partials$v.log 100 env MOE_BACKEND_NVSHMEM_SELF_SEND=1 \
    MOE_BACKEND_NVSHMEM_PADDED_PARTIALS=$v python3 -m moe_backend.cli bench --config deepseek_decode --backend nvshmem \
    --world-size 1 --iters 100 --out "$raw/decode_ws1_partials$v.json"
  grep -E "^nvshmem" "$raw/bench_partials$v.log"
done
