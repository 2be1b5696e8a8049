# Shared preamble of the GPU benchmark scripts; source it from the repository root with $out
# set. One node over NVLink (see scripts/slurm/nvshmem_env.sh), the carried wheels (as
# gpu_check.sh installs them), this checkout on PYTHONPATH, and moe_backend._C built in place
# when it is missing (gpu_check.sh builds it first) unless MOE_BACKEND_DEVSO names a carried build.
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# The commit the benchmark JSON records: the carried .commit first (the device's copy of the
# tree may hold a stale .git; `git rev-parse HEAD > .commit`, then carry it), as gpu_check.sh does.
[ -n "${MOE_BACKEND_COMMIT:-}" ] || MOE_BACKEND_COMMIT=$(cat .commit 2>/dev/null || git rev-parse HEAD 2>/dev/null || echo unknown)
export MOE_BACKEND_COMMIT
export NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-1} NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
source scripts/slurm/nvshmem_env.sh nvlink
source scripts/gpu_wheels.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-}
source scripts/gpu_devso.sh  # MOE_BACKEND_DEVSO: a carried build instead of building here
if ! ls moe_backend/_C*.so >/dev/null 2>&1; then
  echo "building moe_backend._C (log: $out/build.log)"
  TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a} MAX_JOBS=${MAX_JOBS:-8} \
    "$PYTHON" setup.py build_ext --inplace > "$out/build.log" 2>&1 || echo "build failed: nvshmem will be skipped"
fi
