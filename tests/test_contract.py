"""The contract suite on the reference backend, on 2 and 4 gloo ranks (CPU)."""

from __future__ import annotations

import random

import contract_tasks as tasks
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pool import RankPool

from moe_backend import FP8, CommSpec
from moe_backend.testing import ROUTINGS, Case

SEED = random.SystemRandom().randrange(1 << 30)  # fresh inputs every run; printed on failure


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def pool(request):
    p = RankPool(request.param)
    yield p
    p.close()


@pytest.mark.parametrize("tp_size", [1, 2])
def test_contract_matrix(pool: RankPool, tp_size: int) -> None:
    counts = pool.run(tasks.contract_matrix, "reference", tp_size, SEED)
    assert counts == [len(tasks.DTYPE_COMBOS) * len(ROUTINGS) * 3] * pool.world, f"seed {SEED}"


@pytest.mark.parametrize("tp_size, static", [(1, False), (2, False), (1, True)])
def test_padded_matrix(pool: RankPool, tp_size: int, static: bool) -> None:
    """The padded calls through the contract matrix; with static shapes the contiguous result they
    derive from has poison rows past its total (as the GPU backends' do), which must not land."""
    options = {"static_shapes": True} if static else None
    counts = pool.run(tasks.contract_matrix, "reference", tp_size, SEED, options, True)
    assert counts == [len(tasks.DTYPE_COMBOS) * len(ROUTINGS) * 3] * pool.world, f"seed {SEED}"


def test_padded_off_boundary(pool: RankPool) -> None:
    assert pool.run(tasks.padded_off_boundary, "reference", SEED) == [len(tasks.DTYPE_COMBOS)] * pool.world, \
        f"seed {SEED}"


def test_padded_misuse(pool: RankPool) -> None:
    assert pool.run(tasks.padded_misuse, "reference") == [13] * pool.world


def test_bad_inputs(pool: RankPool) -> None:
    assert pool.run(tasks.bad_inputs, "reference") == [tasks.BAD_INPUTS_CPU] * pool.world


def test_split_phases(pool: RankPool) -> None:
    pool.run(tasks.split_phases, "reference")


def test_construction_checks(pool: RankPool) -> None:
    pool.run(tasks.construction_checks, "reference")


def test_failed_receive_ends_round(pool: RankPool) -> None:
    pool.run(tasks.failed_receive_ends_round, "reference")


@st.composite
def cases(draw, world: int) -> Case:
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if world % t == 0]))
    local = draw(st.integers(1, 5))
    in_dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32, FP8]))
    hidden = draw(st.sampled_from([8, 16, 48, 64]))
    spec = CommSpec(
        num_experts=local * world,
        topk=draw(st.integers(1, min(6, local * world))),
        hidden=hidden,
        max_num_tokens=draw(st.integers(1, 20)),
        world_size=world,
        tp_size=tp,
        in_dtype=in_dtype,
        out_dtype=draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32])),
        scale_block_size=draw(st.sampled_from([b for b in (8, 16) if hidden % b == 0])) if in_dtype == FP8 else None,
        combine_in_float32=draw(st.booleans()),
    )
    return Case(
        spec,
        routing=draw(st.sampled_from(ROUTINGS)),
        seed=draw(st.integers(0, 1 << 30)),
        weighted=draw(st.booleans()),
        num_tokens_mode=draw(st.sampled_from(["none", "int", "tensor"])),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_property_random_shapes(pool: RankPool, data) -> None:
    batch = [data.draw(cases(pool.world)) for _ in range(4)]
    assert pool.run(tasks.run_cases, "reference", batch) == [4] * pool.world
    assert pool.run(tasks.run_cases, "reference", batch, None, True) == [4] * pool.world


def test_oracle_catches_a_wrong_layout(pool: RankPool) -> None:
    """The checker itself must fail on a backend that breaks the layout order."""
    with pytest.raises(AssertionError, match="tokens differs from the contract"):
        pool.run(tasks.broken_backend_case)


def test_padded_view(pool: RankPool) -> None:
    pool.run(tasks.padded_view, "reference")


@pytest.mark.parametrize("tp_size", [1, 2])
def test_contract_matrix_static_shapes(pool: RankPool, tp_size: int) -> None:
    """The same checks with the GPU backends' static row count and poisoned padding rows."""
    counts = pool.run(tasks.contract_matrix, "reference", tp_size, SEED + 7, {"static_shapes": True})
    assert counts == [len(tasks.DTYPE_COMBOS) * len(ROUTINGS) * 3] * pool.world, f"seed {SEED}"


@pytest.mark.parametrize("static_shapes", [False, True], ids=["exact", "static"])
def test_host_valid_rows(pool: RankPool, static_shapes: bool) -> None:
    """combine accepts just the valid rows once the handle knows their count on the host."""
    pool.run(tasks.host_valid_rows, "reference", {"static_shapes": static_shapes})
