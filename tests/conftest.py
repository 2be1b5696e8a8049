"""Shared pytest setup: the `gpu` marker, and skipping GPU tests where they cannot run."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu(gpus=2): needs that many CUDA GPUs (runs on the GPU machine, "
                                       "skipped in CI)")


def gpus_needed(marker: pytest.Mark) -> int:
    """GPUs a `gpu` marker asks for: `gpus=N`, else 2 (most GPU tests run two ranks)."""
    need = marker.kwargs.get("gpus", 2)
    if not isinstance(need, int) or need < 1:
        raise ValueError(f"pytest.mark.gpu(gpus={need!r}): gpus must be an int >= 1")
    return need


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    have = torch.cuda.device_count()
    if have and os.environ.get("MOE_TEST_SHARED_GPU", "0") == "1":
        have = max(have, int(os.environ.get("MOE_TEST_WORLD", "2")))  # ranks share a GPU (tests/gpu/_workers.py)
    for item in items:
        marker = item.get_closest_marker("gpu")  # the marker, not the folder name
        need = gpus_needed(marker) if marker is not None else 0
        if have < need:
            item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA GPU(s), has {have}"))
