"""Shared pytest setup: the `gpu` marker, and skipping GPU tests where they cannot run."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
from _workers import shared_gpu  # noqa: E402  (the GPU tests' own switch, read the same way)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu(gpus=2, shared=False): needs that many CUDA GPUs (runs on the GPU "
                                       "machine, skipped in CI); shared=True: one GPU will do under "
                                       "MOE_TEST_SHARED_GPU=1 (the ranks share it)")


def gpus_needed(marker: pytest.Mark, sharing: bool = False) -> int:
    """GPUs a `gpu` marker asks for: `gpus=N`, else 2 (most GPU tests run two ranks); 1 when the
    marker says `shared=True` and the ranks share a GPU (`sharing`: MOE_TEST_SHARED_GPU=1)."""
    need = marker.kwargs.get("gpus", 2)
    if not isinstance(need, int) or need < 1:
        raise ValueError(f"pytest.mark.gpu(gpus={need!r}): gpus must be an int >= 1")
    return 1 if sharing and marker.kwargs.get("shared", False) else need


def shard(spec: str) -> tuple[int, int] | None:
    """MOE_TEST_SHARD=i/n (1 <= i <= n): the i-th of n interleaved parts of the collected tests, so a
    GPU file longer than one device call runs over several; empty: every test."""
    if not spec:
        return None
    parts = spec.split("/")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or not 1 <= int(parts[0]) <= int(parts[1]):
        raise ValueError(f"MOE_TEST_SHARD must be i/n with 1 <= i <= n, got {spec!r}")
    return int(parts[0]), int(parts[1])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    part = shard(os.environ.get("MOE_TEST_SHARD", ""))
    if part is not None:
        i, n = part
        config.hook.pytest_deselected(items=[t for j, t in enumerate(items) if j % n != i - 1])
        items[:] = [t for j, t in enumerate(items) if j % n == i - 1]
    have = torch.cuda.device_count()
    sharing = shared_gpu()
    for item in items:
        marker = item.get_closest_marker("gpu")  # the marker, not the folder name
        need = gpus_needed(marker, sharing) if marker is not None else 0
        if have < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA GPU(s), has {have}"))
