"""Callers under `torch.compile`: a compiled function that calls dispatch and combine breaks its
graph at each call (the calls run eagerly: host-side round state, checks and collectives), and
its results are the eager ones. Plain ops bit for bit against the contract's oracle; the
differentiable ops' outputs and gradients against the same step run eagerly."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_autograd import ATOL, _close, _distributed

from moe_backend import CommSpec, Communicator
from moe_backend.autograd import DifferentiableCommunicator
from moe_backend.launch import spawn
from moe_backend.result import row_local_experts
from moe_backend.testing import ROUTINGS, Case, bitwise_equal, expert_fn, make_inputs, oracle_combine, oracle_dispatch


def _compiled_step_worker() -> None:
    rank = dist.get_rank()
    spec = CommSpec(8, 3, 64, 16, dist.get_world_size(), in_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    comm = Communicator(spec, backend="reference")
    L = spec.num_local_experts

    def step(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, n: int):
        res = comm.dispatch(x, ids, w, None, n)
        local = res.local_experts()
        y = expert_fn(res.tokens, local + rank * L, spec.out_dtype)
        return res, comm.combine(y, res.handle, weights=res.weights)

    compiled = torch.compile(step)
    for i, routing in enumerate(ROUTINGS):
        case = Case(spec, routing, 4000 + i, True, "int")
        groups = make_inputs(case)
        mine = groups[rank]
        res, out = compiled(mine.x, mine.topk_ids, mine.topk_weights, mine.num_tokens)
        want = oracle_dispatch(spec, groups, rank)
        assert bitwise_equal(res.tokens, want.tokens), case.describe()
        assert bitwise_equal(res.tokens_per_expert, want.tokens_per_expert), case.describe()
        assert bitwise_equal(out, oracle_combine(spec, groups, rank, True)), case.describe()
        assert comm._phase == "idle", comm._phase  # the round closed through the compiled caller


def test_compiled_caller_matches_the_oracle() -> None:
    spawn(_compiled_step_worker, 2)


def _compiled_autograd_worker() -> None:
    world = dist.get_world_size()
    spec = CommSpec(num_experts=2 * world, topk=3, hidden=8, max_num_tokens=6, world_size=world,
                    in_dtype=torch.float32, out_dtype=torch.float32)
    ex = DifferentiableCommunicator.create(spec, backend="reference")
    compiled = torch.compile(_distributed)
    for routing in ("uniform", "dropped"):
        for style in ("weighted", "megatron"):
            case = Case(spec, routing, 17, weighted=True, num_tokens_mode="int")
            eager = _distributed(ex, spec, case, style)
            got = compiled(ex, spec, case, style)
            for a, b, what in zip(eager, got, ("out", "grad x", "grad w", "grad experts")):
                _close(b, a, f"{what} {style} {case.describe()}", atol=ATOL, rtol=1e-5)
            assert got[1].abs().sum() > 0 or make_inputs(case)[dist.get_rank()].num_tokens == 0


def test_compiled_differentiable_step_matches_eager() -> None:
    spawn(_compiled_autograd_worker, 2)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu(gpus=1))])
def test_row_local_experts_matches_the_offsets_definition(device: str) -> None:
    """Each row's local expert is the `e` with `offsets[e] <= row < offsets[e + 1]` (empty experts
    included), the last past the total; eagerly and compiled alike (the helper avoids searching a
    slice, which inductor on CUDA shifts), the offsets a view at an offset as the kernels' are."""
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    compiled = torch.compile(row_local_experts)
    for experts in (1, 3, 8, 16):
        counts = torch.randint(0, 4, (experts,), generator=gen)
        counts[int(torch.randint(0, experts, (1,), generator=gen))] = 0  # an empty expert
        flat = torch.cat([torch.tensor([7, 7]), torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        offsets = flat.to(device)[2:]  # storage offset 2
        rows = int(offsets[-1]) + 5  # rows past the total too
        want = torch.tensor([next((e for e in range(experts) if r < int(offsets[e + 1])), experts - 1)
                             for r in range(rows)])
        assert torch.equal(row_local_experts(offsets, rows).cpu(), want), offsets.tolist()
        assert torch.equal(compiled(offsets, rows).cpu(), want), offsets.tolist()
