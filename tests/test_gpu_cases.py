"""The GPU suite's case generator (tests/gpu/_workers.py) at every rank count it serves:
each case is a valid spec for that world, and the attention-TP sizes the issue names
(1, 2 and 4 replicas per group) all occur. Runs on CPU: it builds specs, no kernels."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
import _workers  # noqa: E402


@pytest.mark.parametrize("world", [2, 4, 8])
def test_random_cases_fit_the_world(world: int) -> None:
    cases = _workers.random_cases(seed=12345, count=24, world=world)
    assert all(c.spec.world_size == world for c in cases)
    assert all(c.spec.num_experts % (world // c.spec.tp_size) == 0 for c in cases)
    tps = {c.spec.tp_size for c in cases}
    assert tps == ({1, 2, 4} if world >= 4 else {1, 2}), tps
    # Replicas whose rows take the padded dispatch's slices (more than one 2 KB copy pass a row).
    assert any(c.spec.tp_size > 1 and c.spec.hidden * c.spec.in_dtype.itemsize > 2048 for c in cases)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_random_cases_fit_kernels_sized_for_few_sms(world: int) -> None:
    """With `sources` (1024 per SM of the kernels' num_sms) every arena fits: the prefill-sized
    cases shrink where groups x tokens would pass it, and keep their tokens where not."""
    full = _workers.random_cases(seed=7, count=8, world=world)
    few = _workers.random_cases(seed=7, count=8, world=world, sources=4096)
    for a, b in zip(full, few, strict=True):
        assert b.spec.max_num_tokens == min(a.spec.max_num_tokens, 4096 // a.spec.num_groups)
    assert any(b.spec != a.spec for a, b in zip(full, few, strict=True)) == (world > 2)


def test_gpu_world_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOE_TEST_WORLD", raising=False)
    assert _workers.gpu_world() == 2
    monkeypatch.setenv("MOE_TEST_WORLD", "8")
    assert _workers.gpu_world() == 8
    monkeypatch.setenv("MOE_TEST_WORLD", "1")
    with pytest.raises(ValueError, match="MOE_TEST_WORLD must be >= 2"):
        _workers.gpu_world()


def test_gpu_marker_names_how_many_gpus() -> None:
    from conftest import gpus_needed

    assert gpus_needed(pytest.mark.gpu.mark) == 2
    assert gpus_needed(pytest.mark.gpu(gpus=1).mark) == 1
    # Ranks sharing one GPU: only tests marked shared=True run on one.
    assert gpus_needed(pytest.mark.gpu(shared=True).mark, sharing=True) == 1
    assert gpus_needed(pytest.mark.gpu(shared=True).mark) == 2
    assert gpus_needed(pytest.mark.gpu(gpus=4).mark, sharing=True) == 4
    with pytest.raises(ValueError, match="gpus must be an int >= 1"):
        gpus_needed(pytest.mark.gpu(gpus=0).mark)


def test_test_shards_split_the_suite_and_refuse_bad_specs() -> None:
    """MOE_TEST_SHARD=i/n names one of n parts; anything else is refused, naming the variable."""
    from conftest import shard

    assert shard("") is None
    assert shard("2/3") == (2, 3)
    assert shard("1/1") == (1, 1)
    for bad in ("0/3", "4/3", "3", "a/b", "1/2/3", "-1/2"):
        with pytest.raises(ValueError, match="MOE_TEST_SHARD must be i/n"):
            shard(bad)
