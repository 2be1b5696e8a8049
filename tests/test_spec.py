"""CommSpec validation and derived sizes, and the inputs' alignment (no processes needed)."""

from __future__ import annotations

import pytest
import torch

from moe_backend import FP8, CommSpec, parse_dtype


def spec(**kw) -> CommSpec:
    base = dict(num_experts=8, topk=2, hidden=64, max_num_tokens=16, world_size=2)
    base.update(kw)
    return CommSpec(**base)


@pytest.mark.parametrize(
    "kw, pattern",
    [
        (dict(num_experts=7), "num_experts=7 must be divisible by the group size 2"),
        (dict(topk=9), "topk=9 must be <= num_experts=8"),
        (dict(tp_size=3), "tp_size=3 must divide the group size 2"),
        (dict(hidden=0), "hidden must be a positive int"),
        (dict(in_dtype=torch.int8), "in_dtype must be one of"),
        (dict(out_dtype=FP8), "out_dtype must be one of"),
        (dict(in_dtype=FP8), "fp8 input needs scale_block_size dividing hidden=64, got None"),
        (dict(in_dtype=FP8, scale_block_size=48), "got 48"),
        (dict(scale_block_size=16), "only meaningful with in_dtype fp8"),
    ],
)
def test_bad_spec(kw, pattern) -> None:
    with pytest.raises(ValueError, match=pattern):
        spec(**kw)


def test_derived_sizes() -> None:
    s = spec(num_experts=16, topk=6, world_size=4, tp_size=2, in_dtype=FP8, scale_block_size=16)
    assert (s.num_local_experts, s.num_groups, s.num_scales) == (4, 2, 4)
    assert s.expert_capacity == 2 * 16
    assert s.max_recv_tokens == 2 * 16 * 4  # each token reaches at most min(topk, L) local experts
    assert spec(combine_in_float32=True).transfer_dtype == torch.float32
    assert spec(out_dtype=torch.float16).transfer_dtype == torch.float16


def test_parse_dtype() -> None:
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype("fp8") is FP8
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        parse_dtype("int4")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, FP8])
def test_vector_aligned_copies_only_views_off_a_16_byte_boundary(dtype) -> None:
    from moe_backend.testing import off_boundary
    from moe_backend.validate import vector_aligned

    t = torch.randn(5, 24).to(dtype)
    odd = off_boundary(t)
    assert odd.data_ptr() % 16 == 4
    fixed = vector_aligned(odd)
    assert fixed.data_ptr() % 16 == 0 and fixed.is_contiguous()
    assert torch.equal(fixed.view(torch.uint8), t.view(torch.uint8))
    assert vector_aligned(t).data_ptr() == t.data_ptr()  # aligned: no copy
