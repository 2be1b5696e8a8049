#!/usr/bin/env bash
# NVSHMEM transport presets; source with the preset name: `source nvshmem_env.sh ib`.
#   nvlink  one node, GPUs over NVLink/P2P only (no network transport is loaded)
#   ib      InfiniBand through the CPU proxy thread (IBRC): works without GPUDirect Async
#   ibgda   InfiniBand GPUDirect Async: the GPU drives the NIC itself (needs IBGDA-capable
#           mlx5 NICs and driver support; NVSHMEM falls back to CPU-assisted IBGDA otherwise)
#   efa     AWS EFA through libfabric (p4d/p5 instances)
#   none    leave every NVSHMEM_* variable as the environment has it
# Values already set in the environment win, so a site can pin e.g. NVSHMEM_HCA_LIST.
# Intra-node traffic always uses NVLink/P2P when the GPUs can reach each other.
preset=${1:-${MOE_BACKEND_NVSHMEM_PRESET:-nvlink}}
_set() { if [ -z "${!1:-}" ]; then export "$1=$2"; fi; }
case "$preset" in
  nvlink)
    _set NVSHMEM_REMOTE_TRANSPORT none
    _set NVSHMEM_IB_ENABLE_IBGDA 0
    ;;
  ib)
    _set NVSHMEM_REMOTE_TRANSPORT ibrc
    _set NVSHMEM_IB_ENABLE_IBGDA 0
    ;;
  ibgda)
    _set NVSHMEM_REMOTE_TRANSPORT ibgda
    _set NVSHMEM_IB_ENABLE_IBGDA 1
    _set NVSHMEM_IBGDA_NIC_HANDLER gpu
    ;;
  efa)
    _set NVSHMEM_REMOTE_TRANSPORT libfabric
    _set NVSHMEM_LIBFABRIC_PROVIDER efa
    _set FI_PROVIDER efa
    _set FI_EFA_USE_DEVICE_RDMA 1
    _set NVSHMEM_IB_ENABLE_IBGDA 0
    ;;
  none) ;;
  *)
    echo "nvshmem_env.sh: unknown preset '$preset' (nvlink | ib | ibgda | efa | none)" >&2
    return 2 2>/dev/null || exit 2
    ;;
esac
export MOE_BACKEND_NVSHMEM_PRESET=$preset
unset -f _set
