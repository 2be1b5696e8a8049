"""launch.spawn: every rank joins one process group through the parent's store."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from moe_backend.launch import spawn


def _sum_ranks(expected: int) -> None:
    t = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(t)
    assert int(t) == expected, int(t)


def _fails() -> None:
    raise ValueError("a real failure")


def test_ranks_rendezvous_through_the_parent_store() -> None:
    for _ in range(2):  # a second group right after the first: nothing left bound
        spawn(_sum_ranks, 3, 6, timeout=120)


def test_a_failing_rank_is_reported() -> None:
    with pytest.raises(RuntimeError, match="a real failure"):
        spawn(_fails, 2, timeout=120)
