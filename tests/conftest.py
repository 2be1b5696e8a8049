"""Shared pytest setup: the `gpu` marker, and skipping GPU tests where they cannot run."""

from __future__ import annotations

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs 2 CUDA GPUs (runs on the GPU machine, skipped in CI)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.device_count() >= 2:
        return
    skip = pytest.mark.skip(reason="needs 2 CUDA GPUs")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the marker, not the folder name
            item.add_marker(skip)
