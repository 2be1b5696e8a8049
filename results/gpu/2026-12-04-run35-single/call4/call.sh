#!/bin/bash
# Run 35, call 4: r50's combine kernels through rounds on a shared arena and CUDA-graph replays
# (overlap, pdl-combine, self-send variants, both transports).
set -u
out=$OUT; mkdir -p $out
gunzip -f .devso/r50.so.gz
export MOE_BACKEND_DEVSO=r50
source scripts/gpu_env.sh > /dev/null 2>&1
T0=$(date +%s)
F=tests/gpu/test_nvshmem_single.py
timeout 200 python3 -m pytest -q -m gpu -rA "$F::test_rounds_and_graphs_on_one_gpu[overlap]" \
  "$F::test_rounds_and_graphs_on_one_gpu[pdl-combine]" "$F::test_rounds_and_graphs_on_one_gpu[self-send]" > $out/tests.log 2>&1
echo "pytest rounds and graphs (r50) rc $? at $(( $(date +%s) - T0 )) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $out/tests.log | tail -5
