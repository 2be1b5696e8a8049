#!/usr/bin/env bash
# THE GPU check: install carried wheels, build moe_backend._C in place, run the GPU tests,
# then the benchmarks. Logs and JSON go to the folder given as $1 (else $OUT, else
# /tmp/moe_gpu_check). Run from anywhere; needs 2 GPUs for the tests to do anything.
#   scripts/gpu_check.sh [OUT_DIR]
# MOE_BACKEND_DEVSO=NAME: use the carried .devso/NAME.so (scripts/build_device_extension.sh)
# instead of building, when it loads here.
# GPU_CHECK_WORLD=N (default 2): the multi-GPU tests and the benchmark on N ranks (EP4 / EP8 on
# 4- / 8-GPU machines; the timeout and valid-rows tests stay on 2).
set -uo pipefail
out=${1:-${OUT:-/tmp/moe_gpu_check}}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
# The device copy of the tree has no .git: the commit comes from a carried .commit file
# (`git rev-parse HEAD > .commit`, then carry it) or the environment.
[ -n "${MOE_BACKEND_COMMIT:-}" ] || MOE_BACKEND_COMMIT=$(cat .commit 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)
export MOE_BACKEND_COMMIT
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1} NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
source scripts/gpu_wheels.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1
t0=$(date +%s)
source scripts/gpu_devso.sh  # MOE_BACKEND_DEVSO: a carried build instead of building here
if [ "$devso_loaded" = 1 ]; then
  echo "carried build .devso/$MOE_BACKEND_DEVSO.so loads: not building" | tee "$out/build.log"
else
  MAX_JOBS=${MAX_JOBS:-8} python3 setup.py build_ext --inplace > "$out/build.log" 2>&1
  brc=$?
  echo "build rc=$brc in $(( $(date +%s) - t0 )) s"; tail -n 5 "$out/build.log"
  [ $brc -eq 0 ] || { grep -n "error" "$out/build.log" | head -40; exit $brc; }
fi
python3 -c "import moe_backend._C, moe_backend.backends as b; print('nvshmem backend:', b.nvshmem_available())" 2>&1
# GPU_CHECK_TESTS: a pytest -k expression to run a subset (the full layer bench runs below).
export MOE_TEST_WORLD=${GPU_CHECK_WORLD:-2}
python3 -m pytest -m gpu tests/gpu -q -s -rA -k "${GPU_CHECK_TESTS:-not layer_bench}" 2>&1 | tee "$out/pytest.log"
rc=${PIPESTATUS[0]}
# The benchmark of record: every preset, reference (NCCL), both nvshmem transports, and
# nvlink with the kernels sized for 24 SMs (the budget other libraries give communication).
python3 -m moe_backend.cli bench --all-presets --backend all --sms 24 --world-size "$MOE_TEST_WORLD" \
  --out "$out/bench.json" --plot "$out/bench.png" 2>&1 | tee "$out/bench.log"
# Each performance target met or not, off that JSON (EP2 only: other world sizes are skipped).
python3 scripts/check_targets.py "$out/bench.json" --json "$out/targets.json" 2>&1 | tee "$out/targets.log" || true
# The layer benchmark last, in whatever remains of the time budget (its JSON is rewritten
# after every dispatcher, so a cut-short run still reports the dispatchers it finished).
left=$(( ${GPU_CHECK_BUDGET_S:-300} - SECONDS ))
if [ "$left" -gt 45 ]; then
  timeout "$left" bash scripts/gpu_layer_bench.sh "$out" || echo "layer bench: exit $? (124 = out of time)"
else
  echo "layer bench skipped: ${left}s left of GPU_CHECK_BUDGET_S"
fi
echo "gpu_check: pytest rc=$rc"
exit $rc
