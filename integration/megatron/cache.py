"""One differentiable communicator pair per (process group, CommSpec, backend), process-wide.

Every MoE layer and micro-batch with the same shapes shares it, so symmetric buffers are
allocated once. Creation is collective over the group: all its ranks reach the first
dispatch of a given shape together (they run the same layers in the same order).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from moe_backend.autograd import DifferentiableCommunicator
from moe_backend.spec import CommSpec

_CACHE: dict[tuple[Any, ...], DifferentiableCommunicator] = {}


def get_communicator(
    spec: CommSpec,
    group: dist.ProcessGroup | None,
    backend: str,
    device: torch.device,
    options: dict[str, Any] | None = None,
) -> DifferentiableCommunicator:
    key = (group, spec, backend, device, tuple(sorted((options or {}).items())))
    ex = _CACHE.get(key)
    if ex is None:
        ex = DifferentiableCommunicator.create(spec, group, backend, device, weight_grads=True, **(options or {}))
        _CACHE[key] = ex
    return ex


def clear_cache() -> None:
    """Close every cached communicator (collective for symmetric-memory backends)."""
    for ex in _CACHE.values():
        ex.grad_comm.close()
        ex.comm.close()
    _CACHE.clear()


def cached() -> int:
    return len(_CACHE)
