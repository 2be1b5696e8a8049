"""Bodies of the contract tests, run on every rank of a pool; backend-independent.

The CPU suite runs them on `reference` over gloo; the GPU suite (`_workers.contract_tasks_worker`)
on `nvshmem` over NCCL, both transports, at world sizes 1 and 2.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

from moe_backend import FP8, CommSpec, Communicator, RoundError
from moe_backend.testing import (  # noqa: F401
    DTYPE_COMBOS,
    ROUTINGS,
    Case,
    contract_matrix,
    make_spec,
    off_boundary,
    run_case,
    run_padded_case,
)


def run_cases(backend: str, cases: list[Case], options: dict | None = None, padded: bool = False) -> int:
    for case in cases:
        comm = Communicator(case.spec, backend=backend, **(options or {}))
        (run_padded_case if padded else run_case)(comm, case)
        comm.close()
    return len(cases)


def padded_off_boundary(backend: str, seed: int, options: dict | None = None) -> int:
    """The padded calls on x, x_scale and expert_y that start 4 bytes past a 16-byte boundary (views
    into a larger buffer), every dtype combo: bit for bit the oracle's still. Returns the cases run."""
    done = 0
    for d, dtypes in enumerate(DTYPE_COMBOS):
        spec = make_spec(**dtypes)
        comm = Communicator(spec, backend=backend, **(options or {}))
        routing = ROUTINGS[d % 3]  # uniform, skewed, dropped: rows move
        run_padded_case(comm, Case(spec, routing, seed + d, d % 2 == 0, "tensor"), misaligned=True)
        comm.close()
        done += 1
    return done


def padded_misuse(backend: str, options: dict | None = None) -> int:
    """The padded calls' bad inputs and order: each raises before any communication, naming what
    was wrong, and the communicator stays usable (a good round follows). Returns the checks run."""
    spec = make_spec()
    comm = Communicator(spec, backend=backend, **(options or {}))
    dev = comm.device
    x, ids, w = _inputs(spec, dev)[0][:3]
    L, slots = spec.num_local_experts, spec.num_groups * spec.max_num_tokens
    y = torch.zeros(L, slots, spec.hidden, dtype=spec.out_dtype, device=dev)
    checks = 0
    _raises(TypeError, "PaddedHandle returned by dispatch, got NoneType", lambda: comm.combine_padded(y, None))
    checks += 1
    res = comm.dispatch_padded(x, ids, w)
    _raises(RoundError, "phase 'dispatched'", lambda: comm.dispatch_padded(x, ids, w))
    _raises(TypeError, "dispatch_padded: pass it to combine_padded", lambda: comm.combine(y[0], res.handle))
    _raises(TypeError, "PaddedHandle", lambda: comm.combine_padded(y, object()))
    _raises(ValueError, rf"expert_y must have shape \[{L}, {slots}, {spec.hidden}\]",
            lambda: comm.combine_padded(y[:, :-1], res.handle))
    _raises(TypeError, "expert_y must have dtype", lambda: comm.combine_padded(y.float().half(), res.handle)
            if spec.out_dtype != torch.float16 else comm.combine_padded(y.float(), res.handle))
    _raises(ValueError, "weights must have shape",
            lambda: comm.combine_padded(y, res.handle, weights=res.weights[:, :1]))
    _raises(ValueError, "out must have shape", lambda: comm.combine_padded(
        y, res.handle, out=torch.empty(x.shape[0] + 1, spec.hidden, dtype=spec.out_dtype, device=dev)))
    checks += 7
    comm.combine_padded(y, res.handle, weights=res.weights)
    _raises(RoundError, "phase 'idle'", lambda: comm.combine_padded(y, res.handle))
    contiguous = comm.dispatch(x, ids, w)
    _raises(TypeError, "dispatch: pass it to combine", lambda: comm.combine_padded(y, contiguous.handle))
    comm.combine(torch.zeros(contiguous.tokens.shape[0], spec.hidden, dtype=spec.out_dtype, device=dev),
                 contiguous.handle)
    stale = res.handle
    receiver = comm.dispatch_padded_send(x, ids, w)
    _raises(RoundError, "phase 'dispatch_sent'", lambda: comm.dispatch_padded(x, ids, w))
    res = receiver.recv()
    _raises(RoundError, "already used", receiver.recv)
    _raises(ValueError, "round", lambda: comm.combine_padded(y, stale))
    checks += 5
    out = comm.combine_padded(y, res.handle)
    assert not out.any(), "zero expert outputs must combine to zeros"
    comm.close()
    return checks


def _inputs(spec: CommSpec, device: torch.device, seed: int = 3):
    """Valid inputs for every row (same on all ranks of a group), on the communicator's `device`."""
    gen = torch.Generator().manual_seed(seed + torch.distributed.get_rank() // spec.tp_size)
    rows = spec.max_num_tokens - 2
    x = torch.randn(rows, spec.hidden, generator=gen).to(spec.in_dtype)
    ids = torch.rand(rows, spec.num_experts, generator=gen).argsort(dim=1)[:, : spec.topk]
    w = torch.rand(rows, spec.topk, generator=gen)
    s = torch.rand(rows, spec.num_scales, generator=gen) if spec.in_dtype == FP8 else None
    return [None if t is None else t.to(device) for t in (x, ids, w, s)], device


def _raises(exc: type[BaseException], pattern: str, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except exc as err:
        if not re.search(pattern, str(err)):
            raise AssertionError(f"{exc.__name__} raised but message {str(err)!r} lacks {pattern!r}") from err
        return
    raise AssertionError(f"expected {exc.__name__} matching {pattern!r}, nothing raised")


BAD_INPUTS_CPU = 27


def bad_inputs(backend: str, options: dict | None = None) -> int:
    """Each bad input raises a clear error before communicating; the communicator stays usable.
    Returns how many were refused (BAD_INPUTS_CPU on CPU; one more on a GPU: a CPU tensor)."""
    spec = make_spec(in_dtype=FP8, out_dtype=torch.bfloat16, scale_block_size=16)
    comm = Communicator(spec, backend=backend, **(options or {}))
    (x, ids, w, s), device = _inputs(spec, comm.device)
    T = x.shape[0]
    E = spec.num_experts
    checks = 0

    def expect(exc, pattern, fn):
        nonlocal checks
        _raises(exc, pattern, fn)
        checks += 1

    def check(exc, pattern, **override):
        args = dict(x=x, topk_ids=ids, topk_weights=w, x_scale=s)
        args.update(override)
        expect(exc, pattern, lambda: comm.dispatch(**args))

    check(TypeError, r"x must have dtype .*float8", x=x.float())
    check(ValueError, r"x must have shape \[\*, 32\]", x=torch.zeros(T, 16, dtype=FP8, device=device))
    check(ValueError, r"more than max_num_tokens=12", x=torch.zeros(13, 32, dtype=FP8, device=device))
    check(TypeError, r"x must be a torch.Tensor", x=[1, 2])
    check(TypeError, r"topk_ids must have dtype", topk_ids=ids.float())
    check(ValueError, rf"topk_ids must have shape \[{T}, 3\]", topk_ids=ids[:, :2])
    bad = ids.clone()
    bad[0, 1] = E
    check(ValueError, rf"topk_ids\[0, 1\] = {E} is out of range.*\[0, {E}\)", topk_ids=bad)
    bad = ids.clone()
    bad[0, 2] = -5
    check(ValueError, r"topk_ids\[0, 2\] = -5 is out of range", topk_ids=bad)
    bad = ids.clone()
    bad[0, 1] = bad[0, 0]
    check(ValueError, r"topk_ids row 0 repeats an expert", topk_ids=bad)
    check(ValueError, r"x_scale is required for fp8", x_scale=None)
    check(ValueError, r"x_scale must have shape", x_scale=s[:, :1])
    check(TypeError, r"topk_weights must have dtype .*float32", topk_weights=w.double())
    check(ValueError, rf"num_tokens must be in \[0, {T}\]", num_tokens=T + 1)
    check(ValueError, rf"num_tokens must be in \[0, {T}\]", num_tokens=torch.tensor([T + 1], device=device))
    # An int64 count past int32 is checked before it is narrowed (it once wrapped to 3).
    check(ValueError, rf"num_tokens must be in \[0, {T}\] .*got {2**32 + 3}",
          num_tokens=torch.tensor([2**32 + 3], device=device))
    check(TypeError, r"x must be a dense \(strided\) tensor, got layout torch.sparse_coo", x=x.float().to_sparse())
    check(ValueError, r"topk_weights requires grad, but Communicator is not differentiable",
          topk_weights=w.clone().requires_grad_())
    if device.type != "cpu":
        check(ValueError, r"x must be on", x=x.cpu())

    # Still usable: a valid round goes through after all the rejected calls.
    result = comm.dispatch(x, ids, w, s)
    y = torch.zeros(result.tokens.shape[0], spec.hidden, dtype=spec.out_dtype, device=device)
    expect(TypeError, r"expert_y must have dtype", lambda: comm.combine(y.float(), result.handle))
    expect(ValueError, r"expert_y must have at least", lambda: comm.combine(y[:0], result.handle))
    expect(ValueError, r"out must have shape", lambda: comm.combine(y, result.handle, out=y[:1]))
    expect(TypeError, r"handle must be the Handle", lambda: comm.combine(y, "handle"))
    grad_out = torch.zeros(T, spec.hidden, dtype=spec.out_dtype, device=device, requires_grad=True)
    expect(ValueError, r"out must not require grad", lambda: comm.combine(y, result.handle, out=grad_out))
    odd_out = off_boundary(torch.zeros(T, spec.hidden, dtype=spec.out_dtype, device=device))
    expect(ValueError, r"out must start on a 16-byte boundary", lambda: comm.combine(y, result.handle, out=odd_out))
    expect(ValueError, r"expert_y requires grad", lambda: comm.combine(y.clone().requires_grad_(), result.handle))
    other = Communicator(spec, backend=backend, **(options or {}))
    expect(ValueError, r"another communicator", lambda: other.combine(y, result.handle))
    comm.combine(y, result.handle)
    expect(ValueError, r"handle is from round 1 but the latest dispatch is round 2",
            lambda: (comm.dispatch(x, ids, w, s), comm.combine(y, result.handle)))
    expect(RoundError, r"cannot dispatch while .* 'dispatched'", lambda: comm.dispatch(x, ids, w, s))
    comm.close()
    other.close()
    return checks


def construction_checks(backend: str, options: dict | None = None) -> None:
    """Bad constructor arguments, and ranks that disagree on the communicator, are refused
    with a message naming them (a shape mismatch once aborted the first exchange)."""
    spec = make_spec(in_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    rank = torch.distributed.get_rank()
    opts = options or {}
    _raises(TypeError, r"spec must be a CommSpec, got dict", lambda: Communicator(vars(spec), backend=backend))
    _raises(TypeError, r"group must be a torch.distributed ProcessGroup or None, got str",
            lambda: Communicator(spec, "world", backend=backend))
    _raises(ValueError, r"device must be a torch.device or a name like 'cuda:0' or 'cpu', got 'gpu'",
            lambda: Communicator(spec, backend=backend, device="gpu"))
    _raises(ValueError, r"device must be a CPU or CUDA device, got meta",
            lambda: Communicator(spec, backend=backend, device="meta"))
    _raises(TypeError, r"check_inputs must be True or False",
            lambda: Communicator(spec, backend=backend, check_inputs="no"))
    # Rank 1 asks for another hidden size: every rank refuses, naming rank 1.
    odd = make_spec(in_dtype=torch.bfloat16, out_dtype=torch.bfloat16, hidden=16) if rank == 1 else spec
    if torch.distributed.get_world_size() > 1:
        _raises(ValueError, r"ranks \[1\] of the group build another communicator than rank 0",
                lambda: Communicator(odd, backend=backend, **opts))
    comm = Communicator(spec, backend=backend, **opts)  # still fine after all of that
    run_case(comm, Case(spec, "uniform", seed=13, num_tokens_mode="none"))
    comm.close()


def failed_receive_ends_round(backend: str) -> None:
    """A receive that raises (here, a stand-in for running out of memory) ends the round: the
    next dispatch works instead of failing on a phase no call can leave. Likewise a whole
    combine that fails in its backend."""
    spec = make_spec(in_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    comm = Communicator(spec, backend=backend)
    (x, ids, w, _), _ = _inputs(spec, comm.device, seed=41)
    real = comm.backend.dispatch_recv

    def failing(*args):
        real(*args)  # the exchange completes on every rank; then this rank fails locally
        raise MemoryError("stand-in for an allocation failure")

    comm.backend.dispatch_recv = failing
    _raises(MemoryError, r"stand-in", lambda: comm.dispatch(x, ids, w))
    comm.backend.dispatch_recv = real
    result = comm.dispatch(x, ids, w)
    y = torch.zeros(result.tokens.shape[0], spec.hidden, dtype=spec.out_dtype, device=x.device)
    # A whole combine whose backend raises past the input checks ends the round too.
    real_whole = comm.backend.combine_whole

    def failing_whole(*args):
        real_whole(*args)
        raise MemoryError("stand-in for a failure after the combine's send")

    comm.backend.combine_whole = failing_whole
    _raises(MemoryError, r"after the combine", lambda: comm.combine(y, result.handle))
    comm.backend.combine_whole = real_whole
    _raises(RoundError, r"cannot combine while .* 'idle'", lambda: comm.combine(y, result.handle))
    result = comm.dispatch(x, ids, w)
    comm.combine(y, result.handle)
    comm.close()


def split_phases(backend: str, options: dict | None = None) -> None:
    """Send and receive as separate calls, with other work between; receivers are one-shot.
    `dispatch` goes through the backend's `dispatch_whole` (which may fuse send and receive),
    the split phases through `dispatch_send`, and both give the same rows."""
    spec = make_spec(in_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    comm = Communicator(spec, backend=backend, **(options or {}))
    (x, ids, w, _), device = _inputs(spec, comm.device, seed=11)
    calls: list[str] = []

    def counted(name: str) -> None:
        real = getattr(comm.backend, name)
        setattr(comm.backend, name, lambda *args: (calls.append(name), real(*args))[1])

    counted("dispatch_whole")
    counted("dispatch_send")
    counted("combine_whole")
    counted("combine_send")
    whole = comm.dispatch(x, ids, w)
    assert calls[:1] == ["dispatch_whole"], calls
    calls.clear()
    ref_out = comm.combine(whole.tokens, whole.handle, weights=whole.weights)
    assert calls[:1] == ["combine_whole"], calls

    calls.clear()
    receiver = comm.dispatch_send(x, ids, w)
    assert calls == ["dispatch_send"], calls
    busy = torch.randn(64, 64, device=device) @ torch.randn(64, 64, device=device)  # overlapped work
    split = receiver.recv()
    _raises(RoundError, r"already used", receiver.recv)
    # Rows past the total are unspecified (the nvshmem backend's static shapes leave them as
    # the allocator gave them), so the valid rows are compared.
    split_valid, whole_valid = split.valid(), whole.valid()
    same = torch.equal(split_valid.tokens.view(torch.int16), whole_valid.tokens.view(torch.int16))
    assert same, "split tokens differ"
    assert torch.equal(split_valid.weights, whole_valid.weights), "split weights differ"
    pending = comm.combine_send(split.tokens, split.handle, weights=split.weights)
    busy = busy @ busy
    out = pending.recv()
    assert torch.equal(out.view(torch.int16), ref_out.view(torch.int16)), "split combine differs"
    _raises(RoundError, r"cannot combine while .* 'idle'", lambda: comm.combine(split.tokens, split.handle))
    comm.close()


def broken_backend_case() -> None:
    """Run one case on a reference backend whose receiver reverses each expert's rows."""
    from moe_backend.backends.reference import ReferenceBackend

    spec = make_spec(topk=2)
    comm = Communicator(spec, backend="reference")
    original = ReferenceBackend.dispatch_recv

    def reversed_recv(self, pending):
        got = original(self, pending)
        got.tokens = got.tokens.flip(0)
        return got

    comm.backend.dispatch_recv = reversed_recv.__get__(comm.backend)
    run_case(comm, Case(spec, "uniform", seed=5, num_tokens_mode="none"))


def padded_view(backend: str, options: dict | None = None) -> None:
    """`padded()` places expert e's i-th row at [e, i] and zeros elsewhere, for every dtype."""
    for dtypes in (DTYPE_COMBOS[0], DTYPE_COMBOS[3]):
        spec = make_spec(**dtypes)
        comm = Communicator(spec, backend=backend, **(options or {}))
        (x, ids, w, s), _ = _inputs(spec, comm.device, seed=21)
        result = comm.dispatch(x, ids, w, s)
        batches = result.padded()
        assert batches.shape == (spec.num_local_experts, spec.expert_capacity, spec.hidden), batches.shape
        flat = result.valid().tokens.view(torch.uint8).cpu()
        got = batches.view(torch.uint8).cpu()
        counts = result.tokens_per_expert.tolist()
        start = 0
        for e, c in enumerate(counts):
            assert torch.equal(got[e, :c], flat[start : start + c]), f"expert {e} rows"
            assert not got[e, c:].any(), f"expert {e} padding is not zero"
            start += c
        y = torch.zeros(result.tokens.shape[0], spec.hidden, dtype=spec.out_dtype, device=x.device)
        comm.combine(y, result.handle)
        comm.close()


def host_valid_rows(backend: str, options: dict | None = None) -> None:
    """With the valid row count known on the host, combine takes just those rows, bit for bit."""
    spec = make_spec(in_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    comm = Communicator(spec, backend=backend, **(options or {}))
    (x, ids, w, _), _ = _inputs(spec, comm.device, seed=31)
    # Round 1: every row of the result (rows past the total are unspecified; combine ignores them).
    full = comm.dispatch(x, ids, w)
    rows, known = full.tokens.shape[0], full.handle.host_valid_rows
    want = comm.combine(full.tokens, full.handle, weights=full.weights)
    # Round 2: the same routing, trimmed by valid() (one sync), which records the count.
    result = comm.dispatch(x, ids, w)
    total = int(result.expert_offsets[-1])
    assert known in (None, total), (known, total)
    if known is None:  # not known: the shape-only check must ask for every row
        _raises(ValueError, rf"expert_y must have at least {rows} rows \(the dispatch result's\)",
                lambda: comm.combine(result.tokens[:total], result.handle))
    valid = result.valid()
    assert valid.tokens.shape[0] == total, (valid.tokens.shape, total)
    assert valid.handle.host_valid_rows == total, (valid.handle.host_valid_rows, total)
    assert result.handle is valid.handle, "valid() made a new handle"  # the count is a fact of the round
    _raises(ValueError, r"host_valid_rows must be an int in", lambda: valid.handle.set_host_valid_rows(rows + 1))
    if total > 0:
        _raises(ValueError, r"host_valid_rows is already", lambda: valid.handle.set_host_valid_rows(total - 1))
        _raises(ValueError, rf"expert_y must have at least {total} rows \(the valid rows, handle.host_valid_rows\)",
                lambda: comm.combine(valid.tokens[: total - 1], valid.handle))
        _raises(ValueError, rf"weights must have at least {total} entries",
                lambda: comm.combine(valid.tokens, valid.handle, weights=valid.weights[: total - 1]))
    got = comm.combine(valid.tokens.clone(), valid.handle, weights=valid.weights.clone())
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), "combine of the valid rows differs"
    comm.close()
