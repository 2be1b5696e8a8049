"""The combine's work items and the partial flags they need (CPU: the host side of the nvshmem
backend's layout; no kernels run)."""

from __future__ import annotations

import pytest

from moe_backend.backends.nvshmem_runtime import combine_flags_per_rank, combine_items, layout
from moe_backend.spec import CommSpec


def test_flags_cover_a_call_cut_into_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOE_BACKEND_NVSHMEM_COMBINE_ITEMS", raising=False)
    assert combine_items() == 1024
    # A decode arena: up to 1024 / 2 = 512 slice flags per rank (e.g. 128 tokens x 4 slices).
    assert combine_flags_per_rank(CommSpec(256, 8, 7168, 128, 2)) == 512
    # A prefill arena: one flag per token (one slice) is the most a call of >= 512 tokens needs.
    assert combine_flags_per_rank(CommSpec(256, 8, 7168, 4096, 2)) == 4096
    W, G, M = 2, 2, 128
    assert layout(CommSpec(256, 8, 7168, M, W))["signals"] == 8 * (2 * W + G + G * M + W * 512)


def test_combine_items_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOE_BACKEND_NVSHMEM_COMBINE_ITEMS", "4096")
    assert combine_flags_per_rank(CommSpec(256, 8, 7168, 128, 2)) == 2048
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv("MOE_BACKEND_NVSHMEM_COMBINE_ITEMS", bad)
        with pytest.raises(ValueError, match="COMBINE_ITEMS"):
            combine_items()
