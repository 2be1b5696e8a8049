"""The contract suite's engine: random cases, a loop-based oracle, and bitwise checks.

Every rank draws the inputs of *all* groups from the same seed, so each rank can compute
what it must receive without any communication. The oracle restates docs/CONTRACT.md with
plain loops, independently of any backend. Used by pytest (CPU and GPU) and by
`moe-backend selftest`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from .communicator import Communicator
from .spec import FP8, CommSpec

ROUTINGS = ("uniform", "skewed", "dropped", "empty")
NUM_TOKENS_MODES = ("none", "int", "tensor")

@dataclasses.dataclass
class GroupInputs:
    x: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor | None
    x_scale: torch.Tensor | None
    num_tokens: int


@dataclasses.dataclass(frozen=True)
class Case:
    spec: CommSpec
    routing: str = "uniform"
    seed: int = 0
    weighted: bool = True
    num_tokens_mode: str = "int"

    def describe(self) -> str:
        w = "weighted" if self.weighted else "unweighted"
        return f"{self.spec.describe()} {self.routing} {w} n={self.num_tokens_mode} seed={self.seed}"


def random_topk(gen: torch.Generator, rows: int, spec: CommSpec) -> torch.Tensor:
    """`rows` tokens, each with `spec.topk` distinct random experts (int32)."""
    return torch.rand(rows, spec.num_experts, generator=gen).argsort(dim=1)[:, : spec.topk].to(torch.int32)


def make_inputs(case: Case) -> list[GroupInputs]:
    """All groups' inputs for a case, on the CPU, identical on every rank."""
    spec = case.spec
    gen = torch.Generator().manual_seed(case.seed)
    groups = []
    for g in range(spec.num_groups):
        rows = int(torch.randint(1, spec.max_num_tokens + 1, (1,), generator=gen))
        n = int(torch.randint(0, rows + 1, (1,), generator=gen))
        if case.routing == "empty" and g % 2 == 0:
            n = 0
        ids = random_topk(gen, rows, spec)
        if case.routing == "skewed":  # every token goes to expert 0, at a random position
            has0 = (ids == 0).any(dim=1)
            pos = torch.randint(0, spec.topk, (rows,), generator=gen)
            ids[~has0, pos[~has0]] = 0
        if case.routing == "dropped":
            drop = torch.rand(rows, spec.topk, generator=gen) < 0.35
            ids[drop] = -1
        # Rows past num_tokens must be ignored: fill them with ids no backend may read.
        ids[n:] = spec.num_experts + 12345
        x = torch.randn(rows, spec.hidden, generator=gen) * 2
        scale = None
        if spec.in_dtype == FP8:
            x = x.clamp(-448, 448).to(FP8)
            scale = torch.rand(rows, spec.num_scales, generator=gen) + 0.5
        else:
            x = x.to(spec.in_dtype)
        weights = torch.rand(rows, spec.topk, generator=gen) if case.weighted else None
        groups.append(GroupInputs(x, ids, weights, scale, n))
    return groups


def expert_fn(tokens: torch.Tensor, global_expert: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """A stand-in expert: elementwise, so any backend's batch gives the same bits per row."""
    factor = 1.0 + (global_expert.float() % 7) * 0.375
    return (tokens.float() * factor[:, None]).to(out_dtype)


@dataclasses.dataclass
class Expected:
    tokens: torch.Tensor
    scales: torch.Tensor | None
    weights: torch.Tensor | None
    tokens_per_expert: torch.Tensor
    src_group: torch.Tensor
    src_token: torch.Tensor
    src_k: torch.Tensor


def oracle_dispatch(spec: CommSpec, groups: list[GroupInputs], rank: int) -> Expected:
    """What `rank` must receive, by the contract's loops: each local expert's rows, in group order
    and each group's token order, a token's row at its first k for that expert."""
    L = spec.num_local_experts
    first = rank * L
    hits: list[list[tuple[int, int, int]]] = [[] for _ in range(L)]  # per local expert: (g, t, k)
    for g, inp in enumerate(groups):
        for t, row in enumerate(inp.topk_ids[: inp.num_tokens].tolist()):
            for k, expert in enumerate(row):
                if first <= expert < first + L and row.index(expert) == k:
                    hits[expert - first].append((g, t, k))
    meta = [hit for expert_hits in hits for hit in expert_hits]
    has_scales, has_weights = groups[0].x_scale is not None, groups[0].topk_weights is not None
    rows = [groups[g].x[t] for g, t, _ in meta]
    scales = [groups[g].x_scale[t] for g, t, _ in meta] if has_scales else []
    weights = [groups[g].topk_weights[t, k] for g, t, k in meta] if has_weights else []
    empty = torch.empty(0, spec.hidden, dtype=spec.in_dtype)
    m = torch.tensor(meta, dtype=torch.int32).reshape(-1, 3)
    return Expected(
        tokens=torch.stack(rows) if rows else empty,
        scales=(torch.stack(scales) if scales else torch.empty(0, spec.num_scales)) if spec.in_dtype == FP8 else None,
        weights=(torch.stack(weights) if weights else torch.empty(0)) if has_weights else None,
        tokens_per_expert=torch.tensor([len(h) for h in hits], dtype=torch.int64),
        src_group=m[:, 0],
        src_token=m[:, 1],
        src_k=m[:, 2],
    )


def oracle_combine(spec: CommSpec, groups: list[GroupInputs], group: int, weighted: bool) -> torch.Tensor:
    """The combine output for `group`'s tokens, in the contract's summation order."""
    inp = groups[group]
    L = spec.num_local_experts
    out = torch.zeros(inp.x.shape[0], spec.hidden, dtype=spec.out_dtype)
    for t in range(inp.num_tokens):
        experts = inp.topk_ids[t].tolist()
        total = torch.zeros(spec.hidden, dtype=torch.float32)
        for r in range(spec.world_size):
            acc = None
            for k, expert in enumerate(experts):
                if expert < 0 or expert // L != r:
                    continue
                y = expert_fn(inp.x[t][None], torch.tensor([expert]), spec.out_dtype)[0].float()
                if weighted:
                    y = y * inp.topk_weights[t, k]
                acc = (acc if acc is not None else torch.zeros(spec.hidden)) + y
            if acc is not None:
                total = total + acc.to(spec.transfer_dtype).float()
        out[t] = total.to(spec.out_dtype)
    return out


def bitwise_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    # Compare bytes (NaN and -0.0 included) on fresh dense copies.
    a, b = (torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1).view(torch.uint8) for t in (a, b))
    return torch.equal(a, b)


class ContractError(AssertionError):
    pass


def _expect(ok: bool, what: str, case: Case, rank: int) -> None:
    if not ok:
        raise ContractError(f"rank {rank}: {what} differs from the contract [{case.describe()}]")


@dataclasses.dataclass
class Expectation:
    """A case's inputs (all groups') and the oracle's answer for one rank."""
    groups: list[GroupInputs]
    dispatch: Expected
    combine: torch.Tensor


@functools.lru_cache(maxsize=1)
def expectation(case: Case, rank: int) -> Expectation:
    """The oracle for `rank` in `case`, kept for the latest (case, rank): a worker runs each case
    on several transports and rounds, and the loop oracle takes seconds at prefill sizes. The
    inputs are shared, so a backend that wrote into them would fail the next run of the case."""
    groups = make_inputs(case)
    group = rank // case.spec.tp_size
    return Expectation(groups, oracle_dispatch(case.spec, groups, rank),
                       oracle_combine(case.spec, groups, group, case.weighted))


def run_case(comm: Communicator, case: Case) -> None:
    """Dispatch, run the stand-in experts, combine; check every output bit for bit."""
    spec, rank, device = comm.spec, comm.rank, comm.device
    exp = expectation(case, rank)
    mine, n = _case_inputs(comm, case, exp.groups)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    result = comm.dispatch(to(mine.x), to(mine.topk_ids), to(mine.topk_weights), to(mine.x_scale), n)

    want = exp.dispatch
    total = int(want.tokens_per_expert.sum())
    _expect(bitwise_equal(result.tokens_per_expert, want.tokens_per_expert), "tokens_per_expert", case, rank)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), want.tokens_per_expert.cumsum(0)])
    _expect(bitwise_equal(result.expert_offsets, offsets), "expert_offsets", case, rank)
    _expect(result.tokens.shape[0] >= total, "row count", case, rank)
    _expect(bitwise_equal(result.tokens[:total], want.tokens), "tokens", case, rank)
    for name in ("scales", "weights"):
        got = getattr(result, name)
        _expect(bitwise_equal(None if got is None else got[:total], getattr(want, name)), name, case, rank)
    h = result.handle
    for name in ("src_group", "src_token", "src_k"):
        _expect(bitwise_equal(getattr(h, name)[:total], getattr(want, name)), name, case, rank)

    # Stand-in experts on every received row (rows past `total` are garbage and unused).
    local = torch.repeat_interleave(
        torch.arange(spec.num_local_experts, device=device), result.tokens_per_expert, output_size=total
    )
    global_expert = torch.zeros(result.tokens.shape[0], dtype=torch.int64, device=device)
    global_expert[:total] = local + rank * spec.num_local_experts
    y = expert_fn(result.tokens, global_expert, spec.out_dtype)
    out = comm.combine(y, h, weights=result.weights if case.weighted else None)
    _expect(bitwise_equal(out, exp.combine), "combine output", case, rank)


def _case_inputs(comm: Communicator, case: Case,
                 groups: list[GroupInputs]) -> tuple[GroupInputs, int | torch.Tensor | None]:
    """This rank's group's inputs and its num_tokens in the case's form."""
    mine = groups[comm.rank // comm.spec.tp_size]
    n: int | torch.Tensor | None = {
        "none": None if mine.num_tokens == mine.x.shape[0] else mine.num_tokens,
        "int": mine.num_tokens,
        "tensor": torch.tensor([mine.num_tokens], dtype=torch.int32, device=comm.device),
    }[case.num_tokens_mode]
    return mine, n


def padded_expected(spec: CommSpec, want: Expected) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
    """The oracle's rows in the padded layout: counts `[L, G]` and, per row, its slot
    `(l, g * M + i)` and row index in `want`."""
    L, G, M = spec.num_local_experts, spec.num_groups, spec.max_num_tokens
    counts = torch.zeros(L, G, dtype=torch.int32)
    places = []
    row = 0
    for e in range(L):
        for _ in range(int(want.tokens_per_expert[e])):
            g = int(want.src_group[row])
            places.append((e, g * M + int(counts[e, g]), row))
            counts[e, g] += 1
            row += 1
    return counts, places


def off_boundary(t: torch.Tensor, nbytes: int = 4) -> torch.Tensor:
    """A contiguous copy of `t` whose data starts `nbytes` past a 16-byte boundary: an input that
    kernels must not take as vector-aligned (a view into a larger buffer can be one)."""
    size = t.numel() * t.element_size()
    raw = torch.empty(size + nbytes + 16, dtype=torch.uint8, device=t.device)
    skip = (-raw.data_ptr()) % 16 + nbytes
    out = raw[skip:skip + size].view(t.dtype).view(t.shape)
    return out.copy_(t)


def run_padded_case(comm: Communicator, case: Case, misaligned: bool = False) -> None:
    """`dispatch_padded` (or, for odd seeds, `dispatch_padded_send` + `recv`), the stand-in experts on
    every slot, `combine_padded`; every output bit checked against the oracle (the padded layout's
    rows are the contract's rows). `misaligned`: x, x_scale and expert_y start 4 bytes past a 16-byte
    boundary."""
    spec, rank, device = comm.spec, comm.rank, comm.device
    exp = expectation(case, rank)
    mine, n = _case_inputs(comm, case, exp.groups)
    moved = lambda t: None if t is None else t.to(device)  # noqa: E731
    to = (lambda t: None if t is None else off_boundary(moved(t))) if misaligned else moved  # noqa: E731
    args = (to(mine.x), moved(mine.topk_ids), moved(mine.topk_weights), to(mine.x_scale), n)
    # Odd seeds through the split phases (send, then the receiver's recv), even ones whole.
    result = comm.dispatch_padded_send(*args).recv() if case.seed % 2 else comm.dispatch_padded(*args)
    want = exp.dispatch
    counts, places = padded_expected(spec, want)
    L, slots = spec.num_local_experts, spec.num_groups * spec.max_num_tokens
    _expect(bitwise_equal(result.counts, counts), "padded counts", case, rank)
    _expect(bitwise_equal(result.tokens_per_expert, want.tokens_per_expert), "tokens_per_expert", case, rank)
    _expect(tuple(result.tokens.shape) == (L, slots, spec.hidden), "padded tokens' shape", case, rank)
    at = ([p[0] for p in places], [p[1] for p in places])
    rows = [p[2] for p in places]
    _expect(bitwise_equal(result.tokens.cpu()[at], want.tokens[rows]), "padded tokens", case, rank)
    if want.scales is not None or result.scales is not None:
        got = None if result.scales is None else result.scales.cpu()[at]
        _expect(bitwise_equal(got, want.scales[rows]), "padded scales", case, rank)
    if want.weights is not None or result.weights is not None:
        got = None if result.weights is None else result.weights.cpu()[at]
        _expect(bitwise_equal(got, want.weights[rows]), "padded weights", case, rank)
    h = result.handle
    for name in ("src_token", "src_k"):
        _expect(bitwise_equal(getattr(h, name).cpu()[at], getattr(want, name)[rows]), f"padded {name}", case, rank)
    valid = result.valid_slots().cpu()
    mask = torch.zeros(L, slots, dtype=torch.bool)
    mask[at] = True
    _expect(torch.equal(valid, mask), "valid_slots", case, rank)

    # Stand-in experts on every slot (slots past the counts hold garbage, combine never reads them).
    local = torch.arange(L, device=device)[:, None].expand(L, slots).reshape(-1)
    flat = result.tokens.reshape(L * slots, spec.hidden)
    y = expert_fn(flat, local + rank * L, spec.out_dtype).view(L, slots, spec.hidden)
    y = off_boundary(y) if misaligned else y
    out = comm.combine_padded(y, h, weights=result.weights if case.weighted else None)
    _expect(bitwise_equal(out, exp.combine), "padded combine output", case, rank)


DTYPE_COMBOS: list[dict[str, Any]] = [
    dict(in_dtype=torch.bfloat16, out_dtype=torch.bfloat16),
    dict(in_dtype=torch.float16, out_dtype=torch.float16),
    dict(in_dtype=torch.float32, out_dtype=torch.float32),
    dict(in_dtype=FP8, out_dtype=torch.bfloat16, scale_block_size=16),
    dict(in_dtype=torch.bfloat16, out_dtype=torch.bfloat16, combine_in_float32=True),
    dict(in_dtype=torch.float32, out_dtype=torch.bfloat16),
]


def make_spec(**kw: Any) -> CommSpec:
    """A small spec for the contract matrix: 4 experts per rank, top-3, hidden 32."""
    world = torch.distributed.get_world_size()
    base = dict(num_experts=4 * world, topk=3, hidden=32, max_num_tokens=12, world_size=world)
    base.update(kw)
    return CommSpec(**base)


def contract_matrix(backend: str, tp_size: int, seed: int, options: dict | None = None, padded: bool = False) -> int:
    """Every routing x dtype combo x weighting x num_tokens mode; returns the case count.
    `padded`: each case through `dispatch_padded` / `combine_padded` instead."""
    run = run_padded_case if padded else run_case
    done = 0
    for d, dtypes in enumerate(DTYPE_COMBOS):
        spec = make_spec(tp_size=tp_size, **dtypes)
        comm = Communicator(spec, backend=backend, **(options or {}))
        for r, routing in enumerate(ROUTINGS):
            for m, mode in enumerate(("none", "int", "tensor")):
                weighted = (r + m + d) % 2 == 0
                run(comm, Case(spec, routing, seed + 1000 * d + 10 * r + m, weighted, mode))
                done += 1
        comm.close()
    return done
