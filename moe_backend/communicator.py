"""The public communicator: validates, keeps the round state machine, drives a backend."""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.distributed as dist

from . import validate
from .backends import create_backend, resolve_backend
from .padded import Derived, Padded, PaddedDispatchResult, PaddedHandle, from_received, to_contiguous
from .result import DispatchResult, Handle
from .spec import CommSpec

_ids = itertools.count(1)

# Every public call runs eagerly under torch.compile: a compiled caller breaks its graph here.
# What a call does is host-side (the round state, validation, collectives, kernel launches
# with host-chosen grids), and tracing it gains nothing: the reference backend's
# data-dependent packing even compiled to wrong output aliases (torch 2.14).
_eager = torch.compiler.disable


class RoundError(RuntimeError):
    """A call out of the dispatch -> combine order (see docs/CONTRACT.md)."""


class Communicator:
    """Dispatch/combine for one expert-parallel group and one `CommSpec`.

    Create it on every rank of `group`: construction is collective (the ranks check that they
    agree on the spec, backend and options; symmetric-memory backends allocate).
    Calls alternate: dispatch, then combine with that dispatch's handle.
    """

    def __init__(
        self,
        spec: CommSpec,
        group: dist.ProcessGroup | None = None,
        backend: str = "auto",
        device: torch.device | str | None = None,
        check_inputs: bool = True,
        **backend_options: Any,
    ):
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed must be initialised before creating a Communicator")
        if not isinstance(spec, CommSpec):
            raise TypeError(f"spec must be a CommSpec, got {type(spec).__name__}")
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
        rank = dist.get_rank(group)
        if rank < 0:
            raise ValueError(f"this process (global rank {dist.get_rank()}) is not a member of group")
        world = dist.get_world_size(group)
        if spec.world_size != world:
            raise ValueError(f"spec.world_size={spec.world_size} but the process group has {world} ranks")
        if not isinstance(check_inputs, bool):
            raise TypeError(f"check_inputs must be True or False, got {check_inputs!r}")
        self.spec = spec
        self.group = group
        self.device = _checked_device(device) if device is not None else _default_device(backend)
        self.check_inputs = check_inputs
        self.rank = rank
        self.id = next(_ids)
        resolved = resolve_backend(backend, self.device)  # once: `auto` looks at the device
        _agree(spec, resolved, backend_options, group)
        self.backend = create_backend(resolved, spec, group, self.device, **backend_options)
        self._round = 0
        self._phase = "idle"  # idle -> dispatch_sent -> dispatched -> combine_sent -> idle

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def _expect_phase(self, allowed: str, action: str) -> None:
        if self._phase != allowed:
            raise RoundError(
                f"cannot {action} while the communicator is in phase '{self._phase}' (expected '{allowed}')"
            )

    # -- dispatch ---------------------------------------------------------------------
    @_eager
    def dispatch_send(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor | None = None,
        x_scale: torch.Tensor | None = None,
        num_tokens: int | torch.Tensor | None = None,
    ) -> DispatchReceiver:
        """Start the dispatch; returns the receiver whose `recv()` completes it."""
        return self._send(x, topk_ids, topk_weights, x_scale, num_tokens, whole=False)

    @_eager
    def dispatch(self, x, topk_ids, topk_weights=None, x_scale=None, num_tokens=None) -> DispatchResult:
        """Send and receive in one call. Nothing runs between them, so the backend may fuse
        them (the nvshmem backend: one kernel at decode sizes); use `dispatch_send` to overlap."""
        return self._send(x, topk_ids, topk_weights, x_scale, num_tokens, whole=True)._recv()

    def _send(self, x, topk_ids, topk_weights, x_scale, num_tokens, whole: bool) -> DispatchReceiver:
        self._expect_phase("idle", "dispatch")
        x, ids, weights, scale, n = validate.check_dispatch(
            self.spec, self.device, x, topk_ids, topk_weights, x_scale, num_tokens, self.check_inputs
        )
        send = self.backend.dispatch_whole if whole else self.backend.dispatch_send
        pending = send(x, ids, weights, scale, n)
        self._round += 1
        self._phase = "dispatch_sent"
        return DispatchReceiver(self, self._round, pending, ids, n, x.shape[0])

    # -- combine ----------------------------------------------------------------------
    @_eager
    def combine_send(
        self,
        expert_y: torch.Tensor,
        handle: Handle,
        weights: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> CombineReceiver:
        """Start the combine; returns the receiver whose `recv()` returns the output."""
        y, handle, weights, out = self._combine_args(expert_y, handle, weights, out)
        pending = self.backend.combine_send(y, handle, weights, out)
        self._phase = "combine_sent"
        return CombineReceiver(self, self._round, pending, out)

    @_eager
    def combine(self, expert_y, handle, weights=None, out=None) -> torch.Tensor:
        """Send and receive in one call. Nothing runs between them, so the backend may do it in
        fewer steps (the nvshmem backend: one host call); use `combine_send` to overlap."""
        y, handle, weights, out = self._combine_args(expert_y, handle, weights, out)
        try:
            return self.backend.combine_whole(y, handle, weights, out)
        finally:  # done, or failed past the checks (the send may have started): the round ends
            self._phase = "idle"

    def _combine_args(self, expert_y, handle, weights, out) -> tuple[torch.Tensor, Handle, torch.Tensor | None,
                                                                      torch.Tensor]:
        y, handle, weights, out = validate.check_combine(
            self.spec, self.device, self.id, self._round, expert_y, handle, weights, out
        )
        self._expect_phase("dispatched", "combine")
        if out is None:
            out = torch.empty(handle.num_input_rows, self.spec.hidden, dtype=self.spec.out_dtype, device=self.device)
        return y, handle, weights, out

    # -- the padded layout (moe_backend/padded.py) ----------------------------------------
    @_eager
    def dispatch_padded(self, x, topk_ids, topk_weights=None, x_scale=None, num_tokens=None) -> PaddedDispatchResult:
        """Dispatch into `[L, G * M, hidden]` per-expert batches (see moe_backend.padded), send and
        receive in one call (the nvshmem kernels: one launch). Its handle goes to `combine_padded`."""
        return self._padded_send(x, topk_ids, topk_weights, x_scale, num_tokens, whole=True)._recv()

    @_eager
    def dispatch_padded_send(self, x, topk_ids, topk_weights=None, x_scale=None,
                             num_tokens=None) -> PaddedDispatchReceiver:
        """Start a padded dispatch; the receiver's `recv()` completes it (other GPU work may run
        between, as for `dispatch_send`)."""
        return self._padded_send(x, topk_ids, topk_weights, x_scale, num_tokens, whole=False)

    def _padded_send(self, x, topk_ids, topk_weights, x_scale, num_tokens, whole: bool) -> PaddedDispatchReceiver:
        self._expect_phase("idle", "dispatch")
        x, ids, weights, scale, n = validate.check_dispatch(
            self.spec, self.device, x, topk_ids, topk_weights, x_scale, num_tokens, self.check_inputs
        )
        send = self.backend.dispatch_padded if whole else self.backend.dispatch_padded_send
        pending = send(x, ids, weights, scale, n)  # raises: the round never began
        inner = None
        if pending is None:  # no padded path of the backend's own: from its contiguous dispatch
            inner = self._send(x, ids, weights, scale, n, whole=whole)
        else:
            self._round += 1
            self._phase = "dispatch_sent"
        return PaddedDispatchReceiver(self, self._round, pending, inner, ids, n, x.shape[0])

    @_eager
    def combine_padded(self, expert_y, handle, weights=None, out=None) -> torch.Tensor:
        """Combine expert outputs in the padded layout (`[L, G * M, hidden]`, `weights [L, G * M]`
        or None) into `out [T, hidden]`: the same result and summation order as `combine`."""
        y, handle, weights, out = validate.check_combine_padded(
            self.spec, self.device, self.id, self._round, expert_y, handle, weights, out
        )
        self._expect_phase("dispatched", "combine")
        if out is None:
            out = torch.empty(handle.num_input_rows, self.spec.hidden, dtype=self.spec.out_dtype, device=self.device)
        try:
            state = handle.backend_state
            if isinstance(state, Derived):
                rows_y, rows_w = to_contiguous(state, y, weights)
                return self.backend.combine_whole(rows_y, state.handle, rows_w, out)
            return self.backend.combine_padded(y, handle, weights, out)
        finally:  # done, or failed past the checks: the round ends
            self._phase = "idle"

    def close(self) -> None:
        self.backend.close()
        self._phase = "closed"


class _Receiver:
    def __init__(self, comm: Communicator, round_: int, phase: str):
        self._comm = comm
        self._round = round_
        self._phase = phase
        self._used = False

    def _claim(self) -> None:
        comm = self._comm
        if self._used:
            raise RoundError("this receiver was already used; each send has exactly one recv")
        if comm._round != self._round or comm._phase != self._phase:
            raise RoundError(
                f"stale receiver: it belongs to round {self._round} ({self._phase}) but the communicator "
                f"is at round {comm._round} ({comm._phase})"
            )
        self._used = True

    def _ending_round_on_error(self, receive: Any, *args: Any) -> Any:
        """A receive that raises (out of memory, a peer's timeout) ends the round: the next
        call is a dispatch, not a RoundError about a phase no call can leave."""
        try:
            return receive(*args)
        except BaseException:
            self._comm._phase = "idle"
            raise


class DispatchReceiver(_Receiver):
    def __init__(self, comm, round_, pending, topk_ids, num_tokens, rows):
        super().__init__(comm, round_, "dispatch_sent")
        self._pending = pending
        self._topk_ids = topk_ids
        self._num_tokens = num_tokens
        self._rows = rows

    @_eager
    def recv(self) -> DispatchResult:
        return self._recv()

    def _recv(self) -> DispatchResult:  # also Communicator.dispatch's, inside its one eager frame
        self._claim()
        comm = self._comm
        got = self._ending_round_on_error(comm.backend.dispatch_recv, self._pending)
        comm._phase = "dispatched"
        handle = Handle(
            comm_id=comm.id,
            round=self._round,
            spec=comm.spec,
            num_tokens=self._num_tokens,
            num_input_rows=self._rows,
            tokens_per_expert=got.tokens_per_expert,
            expert_offsets=got.expert_offsets,
            src_group=got.src_group,
            src_token=got.src_token,
            src_k=got.src_k,
            topk_ids=self._topk_ids,
            backend_state=got.backend_state,
            host_valid_rows=got.host_valid_rows,
        )
        return DispatchResult(
            tokens=got.tokens,
            scales=got.scales,
            weights=got.weights,
            tokens_per_expert=got.tokens_per_expert,
            expert_offsets=got.expert_offsets,
            handle=handle,
        )


class PaddedDispatchReceiver(DispatchReceiver):
    def __init__(self, comm, round_, pending, inner: DispatchReceiver | None, topk_ids, num_tokens, rows):
        # pending: the backend's Padded (whole), its send's state, or None (derived through `inner`)
        super().__init__(comm, round_, pending, topk_ids, num_tokens, rows)
        self._inner = inner

    @_eager
    def recv(self) -> PaddedDispatchResult:
        return self._recv()

    def _recv(self) -> PaddedDispatchResult:
        self._claim()
        comm = self._comm
        if self._inner is not None:
            result = self._inner._recv()
            got = from_received(comm.spec, result.tokens, result.scales, result.weights, result.handle)
        elif isinstance(self._pending, Padded):
            got = self._pending
        else:
            got = self._ending_round_on_error(comm.backend.dispatch_padded_recv, self._pending)
        comm._phase = "dispatched"
        handle = PaddedHandle(
            comm_id=comm.id,
            round=self._round,
            spec=comm.spec,
            num_tokens=self._num_tokens,
            num_input_rows=self._rows,
            counts=got.counts,
            src_token=got.src_token,
            src_k=got.src_k,
            topk_ids=self._topk_ids,
            backend_state=got.backend_state,
        )
        return PaddedDispatchResult(got.tokens, got.scales, got.weights, got.counts, got.tokens_per_expert, handle)


class CombineReceiver(_Receiver):
    def __init__(self, comm, round_, pending, out):
        super().__init__(comm, round_, "combine_sent")
        self._pending = pending
        self._out = out

    @_eager
    def recv(self) -> torch.Tensor:
        self._claim()
        out = self._ending_round_on_error(self._comm.backend.combine_recv, self._pending, self._out)
        self._comm._phase = "idle"
        return out


def _checked_device(device: object) -> torch.device:
    """A CPU or an existing CUDA device, with its index (tensors on cuda:0 are not on 'cuda')."""
    try:
        dev = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch.device or a name like 'cuda:0' or 'cpu', got {device!r}") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ValueError(f"device must be a CPU or CUDA device, got {dev}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = dev.index if dev.index is not None else (torch.cuda.current_device() if count else 0)
    if index >= count:
        raise ValueError(f"device {dev}: this process sees {count} CUDA device(s)")
    return torch.device("cuda", index)


def _agree(spec: CommSpec, backend: str, options: dict[str, Any], group: dist.ProcessGroup | None) -> None:
    """Every rank of the group must build the same communicator: a rank with another shape or
    backend would otherwise fail deep inside the first exchange (or hang in the allocation)."""
    mine = f"{spec!r} backend={backend} options={sorted(options.items())!r}"
    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, mine, group=group)
    odd = [r for r, other in enumerate(every) if other != every[0]]
    if odd:
        raise ValueError(f"ranks {odd} of the group build another communicator than rank 0: "
                         f"{every[odd[0]]} vs {every[0]}")


def _default_device(backend: str) -> torch.device:
    """The current CUDA device under NCCL, or for the nvshmem backend (it runs only there, under
    any process group); else the CPU."""
    if torch.cuda.is_available() and (dist.get_backend() == "nccl" or backend == "nvshmem"):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
