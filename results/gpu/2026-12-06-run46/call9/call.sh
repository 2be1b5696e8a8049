#!/bin/bash
# Session 50 (prepared), one GPU, build `pad5` (main's kernels with the padded layout's); carry
# `.commit .devso/pad5.so.gz`. The whole one-GPU file (call 1's 330 s limit cut it after 5
# tests on an H100): a call of its own.
set -u
source scripts/gpu_call.sh pad5
step "one-GPU suite" tests_single.log 560 python3 -m pytest -q -m gpu -rA --durations=15 tests/gpu/test_nvshmem_single.py
grep -E "slowest|s call" "$raw/tests_single.log" | head -16
