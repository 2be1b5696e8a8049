"""Differentiable dispatch/combine over `Communicator`s.

Forward runs the contract's round on `comm`: dispatch, then combine. Backward is the
mirror round on `grad_comm`, in the order autograd reaches the two ops:

1. combine's backward *dispatches* `grad_out` with the forward's routing. The contract's
   deterministic layout makes the received rows line up with the forward's rows, so
   `grad_y[row] = w[row] * grad_out[src]` and `grad_w[row] = dot(grad_out[src], y[row])`
   (float32) are computed locally on the expert rank.
2. dispatch's backward *combines* the token gradients (unweighted) with the handle of that
   backward dispatch, so the communicator's strict alternation holds and no routing is
   exchanged beyond what the ops do. Gradients of the dispatched `weights` ride in the same
   combine: the grad communicator is `4 * topk` columns wider, row `r` writes the four bytes
   of its float32 weight gradient (as the integers 0..255) into columns `4*src_k[r]..+3`.
   Exactly one row in the whole group writes each `(token, k)` slot and every other
   contribution is +0.0, so the sums are exact in any transfer dtype and the bytes arrive
   intact: bit-exact float32 weight gradients with no extra collective.

Both ops are split into a send and a receive autograd node, forward and backward, so work
placed between them (shared experts) can overlap the transfer.

`recv(valid_only=True)` reads `tokens_per_expert` on the host (one sync) and returns only the
`total` valid rows of a backend's static row count; the handle records `total`
(`host_valid_rows`), so combine takes `total` rows, and the backward round (same routing,
same total) dispatches and combines gradients without any static-row padding.

Replicas (`tp_size > 1`): the forward delivers the full output to every replica of a group;
symmetrically, every replica receives the full gradient of its tokens (and of its
`topk_weights`). As in the forward, replica `j` only sends the rows `t % tp_size == j` of
`grad_out`, so the replicas' `grad_out` must be identical (what tensor-parallel code
guarantees for a replicated activation); the gradient is that of *one* logical copy.

Activation checkpointing reruns the forward's rounds in the backward (every rank alike); the
combine receive saves an (empty) tensor so that a recomputation stopped at the last saved
tensor (torch's non-reentrant checkpoint) stops with the round closed.

Rules: use a separate `grad_comm` (see `grad_spec`) so that forwards of other micro-batches
may interleave with a backward; the backward rounds of different layers must not
interleave (autograd's dependency order guarantees it for sequential layers). A schedule
that breaks a rule raises `RoundError` with an explanation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .communicator import CombineReceiver, Communicator, DispatchReceiver, RoundError
from .result import DispatchResult, Handle
from .spec import FP8, OUT_DTYPES, CommSpec

BYTES_PER_WEIGHT = 4  # float32 weight gradients travel as 4 byte-valued columns per k


def grad_spec(spec: CommSpec, weight_grads: bool = True) -> CommSpec:
    """The spec of the communicator that runs the backward of `spec`'s forward.

    It dispatches `grad_out` (forward `out_dtype`) and combines token gradients (forward
    `in_dtype`, or `out_dtype` when the input is fp8 and has no gradient); with
    `weight_grads` it carries `4 * topk` extra columns for the weight gradients.
    """
    out_dtype = spec.in_dtype if spec.in_dtype in OUT_DTYPES else spec.out_dtype
    extra = BYTES_PER_WEIGHT * spec.topk if weight_grads else 0
    return dataclasses.replace(
        spec, hidden=spec.hidden + extra, in_dtype=spec.out_dtype, out_dtype=out_dtype, scale_block_size=None
    )


def _weight_columns(comm: Communicator, grad_comm: Communicator) -> bool:
    """Whether `grad_comm` has room for weight gradients (else it must match `comm`'s hidden)."""
    extra = grad_comm.spec.hidden - comm.spec.hidden
    if extra not in (0, BYTES_PER_WEIGHT * comm.spec.topk):
        raise ValueError(
            f"grad_comm.spec.hidden={grad_comm.spec.hidden} must be {comm.spec.hidden} or "
            f"{comm.spec.hidden + BYTES_PER_WEIGHT * comm.spec.topk}; build it with grad_spec(spec)"
        )
    return extra > 0


class _Link:
    """State shared by the four autograd nodes of one forward round (and its backward)."""

    def __init__(self, ex: DifferentiableCommunicator, topk_ids: torch.Tensor, num_tokens: Any, rows: int):
        self.ex = ex
        self.topk_ids = topk_ids
        self.num_tokens = num_tokens
        self.rows = rows
        self.dispatch_receiver: DispatchReceiver | None = None
        self.result: DispatchResult | None = None
        self.combine_receiver: CombineReceiver | None = None
        self.dispatch_needs_grad = False
        self.weights_need_grad = False
        self.x_dtype: torch.dtype | None = None
        self.valid_only = False  # recv(valid_only=True): trim to the valid rows (one host sync)
        self.host_tokens_per_expert: torch.Tensor | None = None
        # Backward state.
        self.bwd_dispatch: DispatchReceiver | None = None
        self.bwd_handle: Handle | None = None
        self.bwd_combine: CombineReceiver | None = None


def _backward_error(what: str, err: RoundError) -> RoundError:
    return RoundError(
        f"{what}: {err}. The backward of each dispatch/combine pair is one round on grad_comm "
        "(combine's backward dispatches, then dispatch's backward combines); backward rounds of "
        "different pairs must not interleave, and a pair whose combine output reaches the loss must "
        "also have its dispatch inputs in the graph or not require grad at all."
    )


def _share_valid_rows(bwd: Handle, fwd: Handle) -> None:
    """Give the backward round's handle the forward's host-known valid row count.

    The backward dispatch routes the same `topk_ids`/`num_tokens` on a mirrored spec: same
    layout, same total; so its combine accepts the forward's (possibly trimmed) row count.
    """
    if bwd.host_valid_rows is None and fwd.host_valid_rows is not None:
        bwd.set_host_valid_rows(fwd.host_valid_rows)


def _zero_ticket(device: torch.device) -> torch.Tensor:
    # An empty tensor that orders the receive node after the send node in the graph.
    return torch.empty(0, device=device)


class _DispatchSend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, link: _Link, x, topk_weights, x_scale):  # type: ignore[override]
        ex = link.ex
        link.dispatch_receiver = ex.comm.dispatch_send(
            x.detach(),
            link.topk_ids,
            None if topk_weights is None else topk_weights.detach(),
            x_scale,
            link.num_tokens,
        )
        ctx.link = link
        return _zero_ticket(x.device)

    @staticmethod
    def backward(ctx, _grad_ticket):  # type: ignore[override]
        link: _Link = ctx.link
        spec = link.ex.comm.spec
        receiver, link.bwd_combine = link.bwd_combine, None
        if receiver is None:  # dispatch's backward did not run its send half
            raise RoundError("dispatch backward: the combine of the gradients was never sent")
        try:
            out = receiver.recv()
        except RoundError as err:
            raise _backward_error("dispatch backward (combine receive)", err) from None
        grad_x = None if link.x_dtype is None else out[:, : spec.hidden].to(link.x_dtype).contiguous()
        grad_w = None
        if link.weights_need_grad:
            grad_w = _decode_weight_grads(out[:, spec.hidden :], spec.topk)
        return None, grad_x, grad_w, None


class _DispatchRecv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, link: _Link, _ticket):  # type: ignore[override]
        receiver, link.dispatch_receiver = link.dispatch_receiver, None
        result = receiver.recv()
        if link.valid_only:
            # Trim here, inside the node, so the backward gets (and combines) only the
            # valid rows: a trim after this node would make autograd zero-fill all R rows.
            counts = result.tokens_per_expert.cpu()  # the one host sync
            link.host_tokens_per_expert = counts
            result = result.trimmed(int(counts.sum()))
        link.result = result
        ctx.link = link
        ctx.rows = result.tokens.shape[0]
        ctx.has_weights = result.weights is not None
        weights = result.weights if ctx.has_weights else torch.empty(0, device=result.tokens.device)
        # fp8 tokens and absent weights carry no gradient.
        pairs = ((result.tokens, result.tokens.dtype != FP8), (weights, ctx.has_weights))
        frozen = [t for t, differentiable in pairs if not differentiable]
        if frozen:
            ctx.mark_non_differentiable(*frozen)
        return result.tokens, weights

    @staticmethod
    def backward(ctx, grad_tokens, grad_weights):  # type: ignore[override]
        link: _Link = ctx.link
        ex, result = link.ex, link.result
        handle, link.bwd_handle = link.bwd_handle, None
        try:
            if handle is None:
                # combine's backward did not run (its output is not in the loss): open the
                # backward round ourselves with a dispatch of zeros (correct, costs a dispatch).
                gspec = ex.grad_comm.spec
                zeros = torch.zeros(link.rows, gspec.hidden, dtype=gspec.in_dtype, device=ex.grad_comm.device)
                handle = ex.grad_comm.dispatch(zeros, link.topk_ids, None, None, link.num_tokens).handle
            _share_valid_rows(handle, result.handle)
            payload = _grad_payload(ex, result, grad_tokens, grad_weights if ctx.has_weights else None, link)
            link.bwd_combine = ex.grad_comm.combine_send(payload, handle)
        except (RoundError, ValueError) as err:  # a stale handle is a ValueError
            if isinstance(err, ValueError) and "round" not in str(err):
                raise
            raise _backward_error("dispatch backward (combine send)", err) from None
        return None, _zero_ticket(payload.device)


class _CombineSend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, link: _Link, y, weights):  # type: ignore[override]
        result = link.result
        link.combine_receiver = link.ex.comm.combine_send(
            y.detach(), result.handle, None if weights is None else weights.detach()
        )
        ctx.link = link
        ctx.weighted = weights is not None
        if weights is not None:
            ctx.save_for_backward(y, weights)
        else:
            ctx.save_for_backward(y)
        return _zero_ticket(y.device)

    @staticmethod
    def backward(ctx, _grad_ticket):  # type: ignore[override]
        link: _Link = ctx.link
        ex = link.ex
        receiver, link.bwd_dispatch = link.bwd_dispatch, None
        if receiver is None:
            raise RoundError("combine backward: the dispatch of grad_out was never sent")
        try:
            got = receiver.recv()
        except RoundError as err:
            raise _backward_error("combine backward (dispatch receive)", err) from None
        if ctx.weighted:
            y, weights = ctx.saved_tensors
        else:
            (y,), weights = ctx.saved_tensors, None
        _share_valid_rows(got.handle, link.result.handle)
        grad_y, grad_w = _expert_grads(ex.comm.spec.hidden, got, y, weights)
        if link.dispatch_needs_grad:
            link.bwd_handle = got.handle
        else:
            # No dispatch backward will close this round: close it now with an empty combine.
            gspec = ex.grad_comm.spec
            rows = got.handle.host_valid_rows
            rows = got.tokens.shape[0] if rows is None else rows
            zeros = torch.zeros(rows, gspec.hidden, dtype=gspec.out_dtype, device=y.device)
            ex.grad_comm.combine(zeros, got.handle)
        return None, grad_y, grad_w


class _CombineRecv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, link: _Link, ticket):  # type: ignore[override]
        receiver, link.combine_receiver = link.combine_receiver, None
        ctx.link = link
        out = receiver.recv()
        # Saved (empty) so that activation checkpointing that stops its recomputation at the last
        # saved tensor (torch's non-reentrant checkpoint) stops after this receive, not after the
        # combine send's save with the round still open (the next dispatch would be refused).
        ctx.save_for_backward(ticket)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        link: _Link = ctx.link
        gcomm = link.ex.grad_comm
        gspec = gcomm.spec
        g = grad_out.to(gspec.in_dtype)
        if gspec.hidden != g.shape[1]:  # room for the weight-gradient columns
            g = torch.nn.functional.pad(g, (0, gspec.hidden - g.shape[1]))
        try:
            link.bwd_dispatch = gcomm.dispatch_send(g.contiguous(), link.topk_ids, None, None, link.num_tokens)
        except RoundError as err:
            raise _backward_error("combine backward (dispatch send)", err) from None
        return None, _zero_ticket(grad_out.device)


def _expert_grads(
    hidden: int, got: DispatchResult, y: torch.Tensor, weights: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gradients of the expert rows from the dispatched `grad_out` (rows past `total` are 0)."""
    known = got.handle.host_valid_rows
    same_rows = weights is None or weights.shape[0] == y.shape[0]
    if known is not None and y.shape[0] <= known and same_rows:
        # Every row of y is valid: no mask, no zero-filled copy (same values bit for bit).
        g = got.tokens[: y.shape[0], :hidden]
        if weights is None:
            # A fresh copy: got.tokens may live in the backend's receive buffer.
            return torch.empty_like(y).copy_(g), None
        g = g.float()
        grad_y = (weights.float()[:, None] * g).to(y.dtype)
        return grad_y, (g * y.float()).sum(1).to(weights.dtype)
    n = min(y.shape[0], got.tokens.shape[0])
    total = got.expert_offsets[-1]  # device scalar: no host sync
    valid = (torch.arange(n, device=y.device) < total)[:, None]
    g = got.tokens[:n, :hidden].float()
    grad_y = torch.zeros_like(y)
    grad_w = None
    if weights is None:
        grad_y[:n] = torch.where(valid, g, 0.0).to(y.dtype)
    else:
        w = weights[:n].float()[:, None]
        grad_y[:n] = torch.where(valid, w * g, 0.0).to(y.dtype)
        grad_w = torch.zeros_like(weights, dtype=torch.float32)
        grad_w[:n] = torch.where(valid, g * y[:n].float(), 0.0).sum(1)
        grad_w = grad_w.to(weights.dtype)
    return grad_y, grad_w


def _grad_payload(
    ex: DifferentiableCommunicator,
    result: DispatchResult,
    grad_tokens: torch.Tensor | None,
    grad_weights: torch.Tensor | None,
    link: _Link,
) -> torch.Tensor:
    """`[rows, hidden (+ 4*topk)]` rows to combine: token gradients, then encoded weight gradients.

    `rows` = the dispatch result's (the valid rows only after `recv(valid_only=True)`).
    """
    spec, gspec = ex.comm.spec, ex.grad_comm.spec
    rows = result.tokens.shape[0]
    # Uninitialised, then every column is written once (no zero fill under the copies).
    payload = torch.empty(rows, gspec.hidden, dtype=gspec.out_dtype, device=ex.grad_comm.device)
    tok = payload[:, : spec.hidden]
    if grad_tokens is not None and link.x_dtype is not None:
        tok.copy_(grad_tokens)
    else:
        tok.zero_()
    if gspec.hidden > spec.hidden:
        enc = payload[:, spec.hidden :].zero_()
        if grad_weights is not None and link.weights_need_grad:
            _encode_weight_grads(grad_weights, result.handle.src_k[:rows], spec.topk, enc)
    return payload


def _encode_weight_grads(grad_w: torch.Tensor, src_k: torch.Tensor, topk: int, enc: torch.Tensor) -> torch.Tensor:
    """Row r -> the 4 bytes of float32 `grad_w[r]` as values 0..255 in columns 4*k..4*k+3 of
    the zeroed `enc [rows, 4*topk]` (written in place)."""
    rows = grad_w.shape[0]
    byte_values = grad_w.float().contiguous().view(torch.uint8).view(rows, BYTES_PER_WEIGHT).to(enc.dtype)
    # Rows past `total` hold unspecified src_k; clamp keeps the scatter in bounds (combine ignores them).
    k = src_k.long().clamp(0, topk - 1)
    cols = k[:, None] * BYTES_PER_WEIGHT + torch.arange(BYTES_PER_WEIGHT, device=k.device)[None, :]
    return enc.scatter_(1, cols, byte_values)


def _decode_weight_grads(cols: torch.Tensor, topk: int) -> torch.Tensor:
    """Inverse of `_encode_weight_grads` after the combine summed the rows per token."""
    rows = cols.shape[0]
    byte_values = cols.float().round().clamp_(0, 255).to(torch.uint8).contiguous()
    return byte_values.view(rows, topk, BYTES_PER_WEIGHT).view(torch.float32).view(rows, topk)


@dataclasses.dataclass
class Dispatched:
    """A differentiable dispatch result: `tokens` and `weights` carry autograd history."""

    tokens: torch.Tensor
    weights: torch.Tensor | None
    tokens_per_expert: torch.Tensor
    expert_offsets: torch.Tensor
    result: DispatchResult
    _link: _Link = dataclasses.field(repr=False)
    # `recv(valid_only=True)`: the counts read on the host (CPU int64 [L]); else None.
    host_tokens_per_expert: torch.Tensor | None = None

    @property
    def handle(self) -> Handle:
        return self.result.handle


class PendingDispatch:
    """The send half of a differentiable dispatch; `recv()` completes it once."""

    def __init__(self, link: _Link, ticket: torch.Tensor):
        self._link, self._ticket = link, ticket
        self._used = False

    def recv(self, valid_only: bool = False) -> Dispatched:
        """Complete the dispatch. `valid_only`: read `tokens_per_expert` on the host (one
        sync) and return only the valid rows; combine and backward then move no more
        (`host_tokens_per_expert` holds the counts)."""
        _use_once(self)
        link = self._link
        link.valid_only = valid_only
        tokens, weights = _DispatchRecv.apply(link, self._ticket)
        result = link.result
        return Dispatched(
            tokens=tokens,
            weights=weights if result.weights is not None else None,
            tokens_per_expert=result.tokens_per_expert,
            expert_offsets=result.expert_offsets,
            result=result,
            _link=link,
            host_tokens_per_expert=link.host_tokens_per_expert,
        )


class PendingCombine:
    def __init__(self, link: _Link, ticket: torch.Tensor):
        self._link, self._ticket = link, ticket
        self._used = False

    def recv(self) -> torch.Tensor:
        _use_once(self)
        return _CombineRecv.apply(self._link, self._ticket)


def _use_once(pending: PendingDispatch | PendingCombine) -> None:
    if pending._used:
        raise RoundError("this receiver was already used; each send has exactly one recv")
    pending._used = True


def _tensor_or_none(name: str, value: object, optional: bool) -> None:
    """Type checks before autograd reads `.requires_grad` (the communicator checks the rest)."""
    if not (isinstance(value, torch.Tensor) or (optional and value is None)):
        raise TypeError(f"{name} must be a torch.Tensor{' or None' if optional else ''}, got {type(value).__name__}")


class DifferentiableCommunicator:
    """Autograd-aware dispatch/combine: forward on `comm`, backward on `grad_comm`.

    `grad_comm` defaults to `comm`, which works when `in_dtype == out_dtype` and no
    `topk_weights` need gradients; then no other forward may run on `comm` between a
    backward's two ops. Use `create()` to get a matching pair.
    """

    def __init__(self, comm: Communicator, grad_comm: Communicator | None = None):
        for name, value in (("comm", comm), ("grad_comm", grad_comm)):
            if not (isinstance(value, Communicator) or (name == "grad_comm" and value is None)):
                raise TypeError(f"{name} must be a Communicator (DifferentiableCommunicator.create builds both "
                                f"from a spec), got {type(value).__name__}")
        self.comm = comm
        self.grad_comm = grad_comm if grad_comm is not None else comm
        g, f = self.grad_comm.spec, comm.spec
        if (g.num_experts, g.topk, g.max_num_tokens, g.world_size, g.tp_size) != (
            f.num_experts, f.topk, f.max_num_tokens, f.world_size, f.tp_size
        ):
            raise ValueError(f"grad_comm's spec ({g.describe()}) does not mirror comm's ({f.describe()})")
        self.weight_grads = _weight_columns(comm, self.grad_comm)

    @classmethod
    def create(
        cls,
        spec: CommSpec,
        group: Any = None,
        backend: str = "auto",
        device: Any = None,
        weight_grads: bool = True,
        **options: Any,
    ) -> DifferentiableCommunicator:
        """A forward communicator and its grad communicator (both collective to create)."""
        if not isinstance(weight_grads, bool):
            raise TypeError(f"weight_grads must be True or False, got {weight_grads!r}")
        comm = Communicator(spec, group, backend, device, **options)
        # The backward rounds reuse the forward's topk_ids (checked there, if at all): no value
        # checks, which would cost host syncs in every backward.
        grad = Communicator(grad_spec(spec, weight_grads), group, backend, device, **{**options, "check_inputs": False})
        return cls(comm, grad)

    # -- dispatch -----------------------------------------------------------------------
    def dispatch_send(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor | None = None,
        x_scale: torch.Tensor | None = None,
        num_tokens: int | torch.Tensor | None = None,
    ) -> PendingDispatch:
        _tensor_or_none("x", x, optional=False)
        _tensor_or_none("topk_weights", topk_weights, optional=True)
        if x.dtype != self.comm.spec.in_dtype:  # before the backward checks, which assume it
            raise TypeError(f"x must have dtype {self.comm.spec.in_dtype}, got {x.dtype}")
        link = _Link(self, topk_ids, num_tokens, x.shape[0])
        x_grad = x.requires_grad and torch.is_grad_enabled()
        w_grad = topk_weights is not None and topk_weights.requires_grad and torch.is_grad_enabled()
        link.x_dtype = x.dtype if x.dtype != FP8 else None
        link.weights_need_grad = w_grad
        link.dispatch_needs_grad = x_grad or w_grad
        if link.dispatch_needs_grad:
            self._check_backward_possible(x, w_grad)
        ticket = _DispatchSend.apply(link, x, topk_weights, x_scale)
        return PendingDispatch(link, ticket)

    def dispatch(self, x, topk_ids, topk_weights=None, x_scale=None, num_tokens=None, valid_only=False) -> Dispatched:
        return self.dispatch_send(x, topk_ids, topk_weights, x_scale, num_tokens).recv(valid_only)

    # -- combine ------------------------------------------------------------------------
    def combine_send(
        self, expert_y: torch.Tensor, dispatched: Dispatched, weights: torch.Tensor | None = None
    ) -> PendingCombine:
        if not isinstance(dispatched, Dispatched):
            raise TypeError(f"dispatched must be the Dispatched returned by dispatch, got {type(dispatched).__name__}")
        link = dispatched._link
        if link.ex is not self:
            raise ValueError("dispatched belongs to another DifferentiableCommunicator")
        _tensor_or_none("expert_y", expert_y, optional=False)
        _tensor_or_none("weights", weights, optional=True)
        needs_grad = torch.is_grad_enabled() and (
            expert_y.requires_grad or (weights is not None and weights.requires_grad)
        )
        if needs_grad and self.grad_comm.spec.in_dtype != self.comm.spec.out_dtype:
            raise ValueError("grad_comm.spec.in_dtype must equal comm.spec.out_dtype (see grad_spec)")
        ticket = _CombineSend.apply(link, expert_y, weights)
        return PendingCombine(link, ticket)

    def combine(self, expert_y, dispatched: Dispatched, weights=None) -> torch.Tensor:
        return self.combine_send(expert_y, dispatched, weights).recv()

    def _check_backward_possible(self, x: torch.Tensor, w_grad: bool) -> None:
        g, f = self.grad_comm.spec, self.comm.spec
        if w_grad and not self.weight_grads:
            raise ValueError(
                "topk_weights requires grad but grad_comm has no weight-gradient columns; "
                "build it with grad_spec(spec, weight_grads=True) (or DifferentiableCommunicator.create)"
            )
        if x.requires_grad and x.dtype != g.out_dtype:
            raise ValueError(
                f"x requires grad in {x.dtype} but grad_comm combines into {g.out_dtype}; "
                "build it with grad_spec(spec)"
            )
        if g.in_dtype != f.out_dtype:
            raise ValueError("grad_comm.spec.in_dtype must equal comm.spec.out_dtype (see grad_spec)")


__all__ = [
    "BYTES_PER_WEIGHT",
    "DifferentiableCommunicator",
    "Dispatched",
    "PendingCombine",
    "PendingDispatch",
    "grad_spec",
]
