"""Differentiable dispatch/combine (moe_backend.autograd) against a dense single-process reference.

Every rank draws the inputs and expert weights of all DP groups from one seed, runs the
distributed forward/backward on its own group's tokens and its local experts, and checks
outputs and all gradients (tokens, routing weights, expert weights) against the same model
computed densely in-process: every expert on every token.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from moe_backend import CommSpec, Communicator, RoundError
from moe_backend.autograd import DifferentiableCommunicator, grad_spec
from moe_backend.launch import spawn
from moe_backend.testing import Case, GroupInputs, make_inputs

ATOL = 2e-5


def _close(actual, expected, what: str, **tol) -> None:
    """assert_close whose failure message names the check (bound now, not at call time)."""
    torch.testing.assert_close(actual, expected, msg=lambda m, what=what: f"{what}: {m}", **tol)


def _expert_weights(spec: CommSpec, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + 1000)
    return torch.randn(spec.num_experts, spec.hidden, spec.hidden, generator=gen) / spec.hidden**0.5


def _loss_weights(spec: CommSpec, groups: list[GroupInputs], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 2000)
    return [torch.randn(g.x.shape[0], spec.hidden, generator=gen) for g in groups]


def _expert(tokens: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.tanh(tokens @ weight)


def _dense(spec: CommSpec, groups: list[GroupInputs], experts: torch.Tensor, loss_w: list[torch.Tensor]):
    """Outputs and gradients of the whole model, every expert computed locally."""
    experts = experts.clone().requires_grad_()
    xs = [g.x.clone().requires_grad_() for g in groups]
    ws = [g.topk_weights.clone().requires_grad_() for g in groups]
    outs, loss = [], 0.0
    for inp, x, w, lw in zip(groups, xs, ws, loss_w):
        rows = []
        for t in range(x.shape[0]):
            acc = torch.zeros(spec.hidden)
            for k in range(spec.topk):
                e = int(inp.topk_ids[t, k])
                if t < inp.num_tokens and e >= 0:
                    acc = acc + w[t, k] * _expert(x[t : t + 1], experts[e])[0]
            rows.append(acc)
        out = torch.stack(rows)
        outs.append(out.detach())
        loss = loss + (out * lw).sum()
    loss.backward()
    zero_if_unused = lambda t: t.grad if t.grad is not None else torch.zeros_like(t)  # noqa: E731
    return outs, [zero_if_unused(x) for x in xs], [zero_if_unused(w) for w in ws], zero_if_unused(experts)


def _distributed(ex: DifferentiableCommunicator, spec: CommSpec, case: Case, style: str, valid_only: bool = False):
    """This rank's share of the same model through dispatch/combine; returns outputs and grads."""
    rank = ex.comm.rank
    groups = make_inputs(case)
    mine = groups[rank // spec.tp_size]
    L = spec.num_local_experts
    experts = _expert_weights(spec, case.seed)[rank * L : (rank + 1) * L].clone().requires_grad_()
    x = mine.x.clone().requires_grad_()
    w = mine.topk_weights.clone().requires_grad_()
    d = ex.dispatch(x, mine.topk_ids, w, num_tokens=mine.num_tokens, valid_only=valid_only)
    counts = d.tokens_per_expert.tolist()
    total = sum(counts)
    if valid_only:  # only the valid rows, and their count on the host
        assert d.tokens.shape[0] == total and d.weights.shape[0] == total and d.handle.host_valid_rows == total
        assert d.host_tokens_per_expert.tolist() == counts
    segments = torch.split(d.tokens[:total], counts)
    y = torch.cat([_expert(seg, experts[e]) for e, seg in enumerate(segments)] + [d.tokens[total:] * 0])
    if style == "weighted":  # the library applies the weights in combine
        out = ex.combine(y, d, weights=d.weights)
    else:  # Megatron: experts apply the dispatched probs, combine is an unweighted sum
        out = ex.combine(y * d.weights[:, None], d)
    lw = _loss_weights(spec, groups, case.seed)[rank // spec.tp_size]
    (out * lw).sum().backward()
    return out.detach(), x.grad, w.grad, experts.grad


def _check_against_dense(
    spec: CommSpec, seeds: tuple[int, ...], routings: tuple[str, ...], static_shapes: bool = False,
    valid_only: bool = False,
) -> None:
    ex = DifferentiableCommunicator.create(spec, backend="reference", static_shapes=static_shapes)
    rank, L = ex.comm.rank, spec.num_local_experts
    for seed in seeds:
        for routing in routings:
            for style in ("weighted", "megatron"):
                case = Case(spec, routing, seed, weighted=True, num_tokens_mode="int")
                groups = make_inputs(case)
                experts = _expert_weights(spec, seed)
                outs, gx, gw, ge = _dense(spec, groups, experts, _loss_weights(spec, groups, seed))
                out, x_grad, w_grad, e_grad = _distributed(ex, spec, case, style, valid_only)
                g = rank // spec.tp_size
                where = f"rank {rank} {style} {case.describe()}"
                _close(out, outs[g], f"out {where}", atol=ATOL, rtol=1e-5)
                _close(x_grad, gx[g], f"grad x {where}", atol=ATOL, rtol=1e-5)
                _close(w_grad, gw[g], f"grad w {where}", atol=ATOL, rtol=1e-5)
                _close(e_grad, ge[rank * L : (rank + 1) * L], f"grad experts {where}", atol=ATOL, rtol=1e-5)
                # The gradient must not be trivially zero (a broken backward would pass otherwise).
                assert x_grad.abs().sum() > 0 or groups[g].num_tokens == 0


def _worker_dense(
    world: int, tp: int, seeds: tuple[int, ...], static_shapes: bool = False, valid_only: bool = False
) -> None:
    spec = CommSpec(
        num_experts=2 * world, topk=3, hidden=8, max_num_tokens=6, world_size=world, tp_size=tp,
        in_dtype=torch.float32, out_dtype=torch.float32,
    )
    _check_against_dense(spec, seeds, ("uniform", "dropped", "skewed"), static_shapes, valid_only)


@pytest.mark.parametrize("world,tp", [(2, 1), (4, 1), (4, 2)])
def test_matches_dense_reference(world: int, tp: int) -> None:
    spawn(_worker_dense, world, world, tp, (0, 1))


def test_matches_dense_reference_with_static_shapes() -> None:
    """Static row counts with poisoned padding rows (as the GPU backend returns) change nothing."""
    spawn(_worker_dense, 2, 2, 1, (2,), True)


def test_matches_dense_reference_valid_rows_only() -> None:
    """recv(valid_only=True) on static shapes: forward, combine and backward on the valid rows only."""
    spawn(_worker_dense, 2, 2, 1, (3,), True, True)
    spawn(_worker_dense, 4, 4, 2, (4,), True, True)


def _worker_dispatch_only_and_errors() -> None:
    """Dispatch without combine in the graph (fallback round), bit-exact weight grads, errors."""
    world = dist.get_world_size()
    spec = CommSpec(num_experts=4, topk=2, hidden=4, max_num_tokens=5, world_size=world, tp_size=2,
                    in_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    ex = DifferentiableCommunicator.create(spec, backend="reference")
    # The forward checks the ids (the default); the backward reuses them unchecked (no syncs).
    assert ex.comm.check_inputs and not ex.grad_comm.check_inputs
    case = Case(spec, "dropped", seed=3)
    mine = make_inputs(case)[ex.comm.rank // spec.tp_size]
    x = mine.x.clone().requires_grad_()
    # Weights whose float32 bits would not survive a bf16 channel: the byte encoding must keep them.
    w = (mine.topk_weights.double() * 1.2345678).float().requires_grad_()
    d = ex.dispatch(x, mine.topk_ids, w, num_tokens=mine.num_tokens)
    total = int(d.expert_offsets[-1])
    coeff = torch.rand(total, generator=torch.Generator().manual_seed(7)).float() + 0.1234567
    # d(loss)/d(weights[row]) = coeff_exact(row): odd float32 values identified by (token, k).
    row_id = (d.handle.src_token[:total].float() * 10 + d.handle.src_k[:total].float()) * 0.0131 + coeff * 0
    loss = d.tokens[:total].float().sum() + (d.weights[:total] * (row_id + 0.1234567)).sum()
    ex.combine(torch.zeros_like(d.tokens), d)  # closes the forward round; not in the loss
    loss.backward()
    valid = (mine.topk_ids >= 0) & (torch.arange(x.shape[0])[:, None] < mine.num_tokens)
    want_x = valid.sum(1, keepdim=True).expand_as(x).to(torch.bfloat16)
    assert torch.equal(x.grad, want_x), (x.grad, want_x)
    t = torch.arange(x.shape[0])[:, None].float()
    k = torch.arange(spec.topk)[None, :].float()
    want_w = torch.where(valid, (t * 10 + k) * 0.0131 + 0.1234567, 0.0)
    assert torch.equal(w.grad, want_w), (w.grad, want_w)  # bit-exact float32 through bf16

    # Without weight-gradient columns, differentiable weights are refused before communicating.
    plain = DifferentiableCommunicator(ex.comm, Communicator(grad_spec(spec, weight_grads=False), backend="reference"))
    with pytest.raises(ValueError, match="weight-gradient columns"):
        plain.dispatch(x, mine.topk_ids, w, num_tokens=mine.num_tokens)

    # Interleaving two backward rounds is refused with an explanation.
    pairs = []
    for _ in range(2):
        xi = mine.x.clone().requires_grad_()
        di = ex.dispatch(xi, mine.topk_ids, num_tokens=mine.num_tokens)
        yi = (di.tokens * 2).requires_grad_()
        pairs.append((ex.combine(yi, di), yi))
    torch.autograd.grad(pairs[0][0].float().sum(), pairs[0][1])  # combine backward only: round left open
    with pytest.raises(RoundError, match="must not interleave"):
        torch.autograd.grad(pairs[1][0].float().sum(), pairs[1][1])

    # Bad arguments are named before autograd touches them.
    fresh = DifferentiableCommunicator.create(spec, backend="reference")
    with pytest.raises(TypeError, match="comm must be a Communicator .* got CommSpec"):
        DifferentiableCommunicator(spec)
    with pytest.raises(TypeError, match="weight_grads must be True or False, got 'no'"):
        DifferentiableCommunicator.create(spec, backend="reference", weight_grads="no")
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        fresh.dispatch([1.0], mine.topk_ids)
    with pytest.raises(TypeError, match="topk_weights must be a torch.Tensor or None, got list"):
        fresh.dispatch(mine.x, mine.topk_ids, [0.5])
    with pytest.raises(TypeError, match=r"x must have dtype torch.bfloat16, got torch.float32"):
        fresh.dispatch(mine.x.float().requires_grad_(), mine.topk_ids)
    pending = fresh.dispatch_send(mine.x, mine.topk_ids, num_tokens=mine.num_tokens)
    d = pending.recv()
    with pytest.raises(RoundError, match="this receiver was already used"):
        pending.recv()
    with pytest.raises(TypeError, match="expert_y must be a torch.Tensor, got list"):
        fresh.combine([0.0], d)
    sent = fresh.combine_send(torch.zeros_like(d.tokens), d)
    sent.recv()
    with pytest.raises(RoundError, match="this receiver was already used"):
        sent.recv()


def test_dispatch_only_fallback_exact_weight_grads_and_errors() -> None:
    spawn(_worker_dispatch_only_and_errors, 4)


def test_grad_spec_mirrors_forward() -> None:
    spec = CommSpec(num_experts=8, topk=2, hidden=16, max_num_tokens=4, world_size=2,
                    in_dtype=torch.float8_e4m3fn, out_dtype=torch.bfloat16, scale_block_size=8)
    g = grad_spec(spec)
    assert (g.hidden, g.in_dtype, g.out_dtype, g.scale_block_size) == (24, torch.bfloat16, torch.bfloat16, None)
    assert dataclasses.replace(g, hidden=16, in_dtype=spec.in_dtype, scale_block_size=8) == spec
    assert grad_spec(spec, weight_grads=False).hidden == 16


def _worker_recomputed() -> None:
    """The layer under activation checkpointing, both of torch's forms: the forward's rounds run
    again in the backward, and outputs and gradients equal those without checkpointing. The
    non-reentrant form stops its recomputation at the last saved tensor: the round must be
    closed by then (the combine receive saves one), or the next step's dispatch is refused.
    Evaluation forwards between the steps (no graph, or one never used) close their rounds too."""
    from torch.utils.checkpoint import checkpoint

    world, rank = dist.get_world_size(), dist.get_rank()
    spec = CommSpec(num_experts=2 * world, topk=3, hidden=8, max_num_tokens=6, world_size=world,
                    in_dtype=torch.float32, out_dtype=torch.float32)
    ex = DifferentiableCommunicator.create(spec, backend="reference")
    L = spec.num_local_experts
    case = Case(spec, "uniform", 21, weighted=True, num_tokens_mode="int")
    groups = make_inputs(case)
    mine, lw = groups[rank], _loss_weights(spec, groups, 21)[rank]

    def layer(x: torch.Tensor, w: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        d = ex.dispatch(x, mine.topk_ids, w, num_tokens=mine.num_tokens)
        counts = d.tokens_per_expert.tolist()
        total = sum(counts)
        segments = torch.split(d.tokens[:total], counts)
        y = torch.cat([_expert(seg, experts[e]) for e, seg in enumerate(segments)] + [d.tokens[total:] * 0])
        return ex.combine(y, d, weights=d.weights)

    def steps(run) -> tuple[torch.Tensor, ...]:
        """Two training steps, with the evaluation forms between them: no_grad, inference_mode and
        a forward whose graph is dropped unused (each a whole round with no backward)."""
        experts = _expert_weights(spec, 21)[rank * L : (rank + 1) * L].clone().requires_grad_()
        x, w = mine.x.clone().requires_grad_(), mine.topk_weights.clone().requires_grad_()
        for _ in range(2):  # the second step's dispatch finds the round closed
            out = run(x, w, experts)
            (out * lw).sum().backward()
            with torch.no_grad():
                evaluated = run(x, w, experts)
            with torch.inference_mode():
                inferred = run(x.detach().clone(), w.detach().clone(), experts.detach().clone())
            run(x, w, experts)  # its graph is dropped
            assert torch.equal(evaluated, out.detach()) and torch.equal(inferred, out.detach())
        return out.detach(), x.grad, w.grad, experts.grad

    plain = steps(layer)
    for reentrant in (False, True):
        got = steps(lambda *a, r=reentrant: checkpoint(layer, *a, use_reentrant=r))
        for a, b, what in zip(plain, got, ("out", "grad x", "grad w", "grad experts")):
            _close(b, a, f"{what}, reentrant={reentrant}", atol=0, rtol=0)
        assert ex.comm._phase == "idle" and ex.grad_comm._phase == "idle", (ex.comm._phase, ex.grad_comm._phase)


def test_checkpointed_and_evaluation_forwards_close_their_rounds() -> None:
    spawn(_worker_recomputed, 2)
