#!/bin/bash
# Session 50 (call 5, same warm H100), build `pad3`, after the fix to the case generator (the fixed
# tp_size=2 case only where the world is even); carry `.commit .devso/pad3.so.gz`.
source scripts/gpu_call.sh pad3 >/dev/null 2>&1; step "padded one GPU" tests_padded_single.log 150 python3 -m pytest -q -m gpu -rA -x tests/gpu/test_nvshmem_single.py -k padded; grep -E "padded:|Error" "$raw/tests_padded_single.log" | head -5
