#!/usr/bin/env bash
# Layer benchmark on a 2-GPU machine: one Megatron MoELayer, forward + backward, with each
# dispatcher (nvshmem, reference, alltoall, allgather, flex if DeepEP/HybridEP imports) on
# the DeepSeek-like and Mixtral-like shapes; the dispatch+combine share of the layer time.
#   scripts/gpu_layer_bench.sh OUT_DIR [extra layer-bench arguments, e.g. --quick]
# Writes OUT_DIR/layer_bench.json, OUT_DIR/layer_bench.log (the table is in the log).
# Runs after scripts/gpu_check.sh (which builds moe_backend._C in place); builds it here
# when missing. Uses $PYTHON (default python3) with this checkout on PYTHONPATH.
# Exit status: layer-bench's (0; 3 = a dispatcher failed, its error is in the JSON).
set -uo pipefail
out=${1:-${OUT:-/tmp/moe_gpu_layer_bench}}
shift || true
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1} NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
# One node, NVLink only (see scripts/slurm/nvshmem_env.sh).
source scripts/slurm/nvshmem_env.sh nvlink
if ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels, as gpu_check.sh installs them
  [ -d /tmp/site ] || "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
if ! ls moe_backend/_C*.so >/dev/null 2>&1; then
  echo "building moe_backend._C (log: $out/build.log)"
  TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-8} \
    "$PYTHON" setup.py build_ext --inplace > "$out/build.log" 2>&1 || echo "build failed: nvshmem will be skipped"
fi
export MOE_BACKEND_COMMIT=${MOE_BACKEND_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1
"$PYTHON" -m moe_backend.cli layer-bench --shapes deepseek mixtral --out "$out/layer_bench.json" "$@" \
  2>&1 | tee "$out/layer_bench.log"
rc=${PIPESTATUS[0]}
echo "gpu_layer_bench: rc=$rc; results in $out/layer_bench.json"
exit $rc
