"""Backend registry: `reference` everywhere, `nvshmem` where the native extension loads."""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

from ..spec import CommSpec
from .base import Backend, Received

BACKENDS = ("auto", "reference", "nvshmem")

__all__ = ["BACKENDS", "DEFAULT_WAIT_S", "TRAINING_WAIT_S", "Backend", "Received", "create_backend",
           "nvshmem_available", "resolve_backend"]


# How long a receive of the nvshmem backend waits for a late peer before its round fails
# (`timeout_s`). The library's default fails fast, as inference wants; training ranks lag each
# other by seconds at times (data loading, checkpoints, a first step's compilation), so the
# Megatron dispatcher and `moe-backend train` wait longer (NCCL's default in torch is 10 min).
DEFAULT_WAIT_S = 10.0
TRAINING_WAIT_S = 300.0

# The kernels are compiled for sm_90a only (csrc/build.py): code for it runs on compute
# capability 9.0 (H100, H200, GH200) and on no other, older or newer.
KERNEL_CAPABILITY = (9, 0)


def nvshmem_available(device: torch.device | None = None) -> tuple[bool, str]:
    """Whether the nvshmem backend can run on `device` (default: the current CUDA device), and
    why not when it cannot."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    capability = torch.cuda.get_device_capability(device)
    if capability != KERNEL_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return False, (f"the kernels are built for sm_90a (H100 / H200); {name} is sm_{capability[0]}{capability[1]}")
    try:
        from . import nvshmem  # noqa: F401
    except ImportError as err:
        return False, f"native extension unavailable: {err}"
    return True, "ok"


def resolve_backend(name: str, device: torch.device) -> str:
    """`auto` -> `nvshmem` where its kernels can run on `device`, else `reference`."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        if device.type != "cuda":
            return "reference"
        ok, why = nvshmem_available(device)
        if not ok:  # said once a process (one place, one message)
            warnings.warn(f"backend 'auto' on {device} takes 'reference': the nvshmem kernels cannot run ({why}); "
                          "the reference is the correctness oracle and takes milliseconds an op on GPUs",
                          stacklevel=1)
        return "nvshmem" if ok else "reference"
    return name


def create_backend(
    name: str, spec: CommSpec, group: dist.ProcessGroup | None, device: torch.device, **options: Any
) -> Backend:
    name = resolve_backend(name, device)
    if name == "reference":
        unknown = sorted(set(options) - {"static_shapes"})
        if unknown:
            raise ValueError(f"the reference backend takes only 'static_shapes', got {unknown}")
        if not isinstance(options.get("static_shapes", False), bool):
            raise ValueError(f"static_shapes must be True or False, got {options['static_shapes']!r}")
        from .reference import ReferenceBackend

        return ReferenceBackend(spec, group, device, **options)
    ok, why = nvshmem_available(device if device.type == "cuda" else None)
    if not ok:
        raise RuntimeError(f"backend 'nvshmem' is unavailable: {why}")
    if device.type != "cuda":
        raise ValueError(f"backend 'nvshmem' needs a CUDA device, got {device}")
    from .nvshmem import NvshmemBackend

    return NvshmemBackend(spec, group, device, **options)
