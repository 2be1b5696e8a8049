"""The `nvshmem` backend: four split kernels (csrc/*_kernels.cuh, launched from csrc/moe_kernels.cu) over NVSHMEM.

Options: `transport="auto"|"put"|"nvlink"` (auto: nvlink when every peer's symmetric memory is
reachable through `nvshmem_ptr`), `timeout_s` (bound of every device-side wait, default
DEFAULT_WAIT_S = 10 s; training's is TRAINING_WAIT_S), `sync_check` (synchronise the stream
after each receive and raise a timeout at once; for tests and debugging: it is a host sync),
`num_sms` (SMs the kernels size their grids for, default every SM: fewer leaves the rest to
concurrent compute; the grids then hold num_sms SMs' worth of threads: at most num_sms blocks of
the plan, copy and combine kernels and 3 * num_sms 128-thread dispatch-send blocks, which the
hardware may place on more SMs than num_sms), `send_stream` (see Overlap below).

Errors: a timed-out wait records (phase, peer rank) in pinned host memory and the kernel
exits. The backend checks that word, without any device sync, at the start of every op and
after every receive, so the `RuntimeError` naming phase and peer surfaces at the latest at
the next op (at once with `sync_check=True`, or after any stream sync with `check_error()`).
No host sync anywhere else: all four ops can be captured in a CUDA graph.

Tuning variables (`MOE_BACKEND_NVSHMEM_*`, read when an arena is created, each named below or in
docs/PERF_NOTES.md with its measurement): a name the backend does not know (a misspelt switch)
or a value its reader would not take (`0`/`1` for the switches, positive integers for the
counts) raises `ValueError` before anything is allocated (nvshmem_env.check_env).

Own group: the send skips the ranks of its own group, whose receive copies those tokens from
its own `x` / `x_scale` (identical on every replica). So `x` and `x_scale` must not be modified
between `dispatch_send` and `dispatch_recv` (the extension holds a reference until then).

Overlap: `dispatch_send` also launches the receive side (plan + copy kernels) on a side
stream of the arena, concurrent with the send; `dispatch_recv` joins it (events, graph
capturable). On for arenas of at most 256 source tokens per SM of `num_sms`, and for any arena
when `num_sms` is at most half the GPU's SMs (the waiting kernels then leave the send room).
`MOE_BACKEND_NVSHMEM_OVERLAP=0` (read when an arena is created) turns it off.
A whole `dispatch` (no work between send and receive) is one fused kernel, send then
receive in the same blocks, wherever the direct receive runs (small arenas: decode);
`MOE_BACKEND_NVSHMEM_FUSED_DISPATCH=0` keeps the two kernels.
Likewise `combine_send` launches the combine receive (into the `out` the communicator hands
it) concurrently, for arenas of at most 1024 source tokens (measured faster there, slower at
prefill sizes); `combine_recv` joins. `MOE_BACKEND_NVSHMEM_COMBINE_OVERLAP=0` turns it off.
A whole `combine` runs send and receive from one host call; where the call has more items than
the side stream's receive grid, both on the caller's stream, the receive launched by PDL (no fork
or join) with a warp per item of the call, more blocks than SMs where the call has the items, and
otherwise on the side stream (`MOE_BACKEND_NVSHMEM_WHOLE_COMBINE=1`: every call by PDL, `=0`: none;
`MOE_BACKEND_NVSHMEM_WIDE_RECV=0`: the side stream's grid, and so the side stream by default).
On nvlink, arenas of at most 32 tokens send their combine partials, and the dispatch rows that
cross to another rank, as round-tagged words that the receive polls, with no flag to release or
wait for (`MOE_BACKEND_NVSHMEM_LL_COMBINE=k` / `MOE_BACKEND_NVSHMEM_LL_ROWS=k`: arenas of at most
k tokens, where the arena has room for them; 0 never). Larger nvlink arenas with that room (the
decode ones, up to 128 tokens at top-8) tag the partials of each call whose round has at most k
tokens on every rank (`MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL=0`: never).
`MOE_BACKEND_NVSHMEM_PUT_TAGGED=1` (off by default, round 63) gives put arenas the same tagged
partials, staged and put with no signal: only where the fabric writes aligned 8-byte words whole
(P2P stores do; over IB or EFA run the contract suite there first); every rank must agree.
For arenas past the overlap limit (more than 1024 source tokens) `combine_send` launches one
fused kernel on the side stream that sends, then receives, in the same blocks
(`MOE_BACKEND_NVSHMEM_COMBINE_FUSED=0` keeps a send and a receive kernel). Its send loads the
expert rows by bulk copies into a per-warp ring, and its receive half then takes the partials by
bulk copies through the same ring (`MOE_BACKEND_NVSHMEM_COMBINE_BULK_RECV=0` keeps register loads
there); `MOE_BACKEND_NVSHMEM_COMBINE_BULK=0` loads the rows by cp.async instead (with
`MOE_BACKEND_NVSHMEM_COMBINE_ASYNC=0` too: into registers).
Each combine call cuts a token's partial into slices (a warp and a flag each) until it has about
1024 work items (`MOE_BACKEND_NVSHMEM_COMBINE_ITEMS`), from the round's largest token count.
The two-kernel combine's send loads a step's expert rows (1 KB each, top-k at most 8) by one bulk
copy a row into the warp's shared memory, all of an item's rows behind one wait
(`MOE_BACKEND_NVSHMEM_COMBINE_STEP_BULK=0`: registers, four rows a batch).
The copy kernel of the dispatch receive cuts each token's row into pieces, one warp each,
when the arena's tokens alone would not fill a block per SM (`MOE_BACKEND_NVSHMEM_COPY_PIECES=k`
caps the pieces per token; 1 = one warp per token); for such small arenas it is launched
programmatically (PDL) beside the plan kernel (`MOE_BACKEND_NVSHMEM_PDL=0` never, `=1` for
every arena; docs/PERF_NOTES.md, round 13). For larger arenas (one warp per token, from a work
counter) a warp loads the token's row into shared memory by one bulk (TMA) copy and writes each
expert row by one bulk store, where rows are 16-byte aligned (`MOE_BACKEND_NVSHMEM_COPY_BULK=0`
stores from registers); the plan kernel reads the per-chunk counts by 16-byte loads where the
local experts are a multiple of 4 (`MOE_BACKEND_NVSHMEM_PLAN_VEC=0`: 4-byte loads; round 33).
Copy-engine send (nvlink, overlap on): when nearly every token has an expert on each other
rank (>= 0.99 by the routing's combinatorics: e.g. 256 experts, top-8, 2 ranks, not 4) and a whole
`dispatch` sends >= 1024 tokens, the tokens cross by copy-engine copies in 4 chunks, each chunk's flags
raised by a small kernel, instead of by the send kernel's SM stores: the SMs are left to the
receive (DeepSeek prefill dispatch 263 -> 231 us, docs/PERF_NOTES.md, round 15). Every token then
crosses to every other group. Off with `CUDA_DEVICE_MAX_CONNECTIONS=1` (one hardware queue:
the receive would wait behind the chunks). Not for a split `dispatch_send` by default: its flag
kernels start only as the chunks' copies end, behind whatever the caller queued meanwhile, and a
kernel there that fits no SM beside the receive's waiting copy blocks deadlocked both ranks at
EP2 (docs/PERF_NOTES.md, run 39 at EP2). `MOE_BACKEND_NVSHMEM_CE_SEND=0` never, `=1` for every
call, split ones too; `MOE_BACKEND_NVSHMEM_CE_CHUNKS=k` sets the chunks, `MOE_BACKEND_NVSHMEM_CE_DECAY=d`
(0 < d <= 1, default 0.6; 1: equal) makes each chunk d times the one before, and
`MOE_BACKEND_NVSHMEM_CE_STREAMS=k` (1..4, default 1) copies chunk c on stream c % k. A one-block
kernel behind each chunk's copies raises its token flags; `MOE_BACKEND_NVSHMEM_CE_FLAG_COPY=1`
(prepared, not yet measured) has the chunk's copy stream copy them instead, right behind its
rows. It enables peer access to the peers' devices (a context on each).
Option `send_stream=True` also moves the dispatch send kernel off the caller's stream, so
work issued between `dispatch_send` and `dispatch_recv` runs beside the whole dispatch, not
after the send kernel. For split use with work in between; off by default because the extra
stream hop costs ~1-2 us on a dispatch with nothing in between (docs/PERF_NOTES.md, round 7).
Such an arena's split receive also takes as few blocks as its tokens fill (a warp per piece,
not a block per piece): it waits beside the caller's work, and every SM it holds is one that
work cannot use (round 61; `MOE_BACKEND_NVSHMEM_COMPACT_RECV=0` never, `=1` in every arena).
Where the arena's expected rows fit ~8 us of 4 SMs' stores (up to 16 bf16 DeepSeek tokens a rank),
its split send and receive are sized for the 4 SMs a one-wave matmul leaves free (round 62;
`MOE_BACKEND_NVSHMEM_OVERLAP_SMS=k`: k SMs whatever the rows, k >= the GPU's SMs: never).
`MOE_BACKEND_NVSHMEM_TWO_PART_RECV=1` (off by default, round 64) splits such an arena's receive in
two launches that claim its items from one counter: 4 blocks with the send, the rest launched by
`dispatch_recv` behind the caller's work; slower as built (run 45: 32.6 -> 42.1 us, the
world-size-1 overlap row at 64 tokens), kept for its A/B.
Padded layout (`Communicator.dispatch_padded` / `combine_padded`): on nvlink arenas whose rows
are multiples of 16 bytes (topk <= 32), two kernels of their own (csrc/padded_kernels.cuh) over a
region the arena allocates at the first `dispatch_padded` (collective); elsewhere, or with
`MOE_BACKEND_NVSHMEM_PADDED=0`, the communicator derives the layout from the contiguous ops.
The padded combine sums each source token's rows on the expert's rank into one partial sent as
round-tagged words (rounds 66-67); `MOE_BACKEND_NVSHMEM_PADDED_PARTIALS=0` sends every slot's row
back behind a flag instead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .. import _C  # noqa: F401  (ImportError here = backend unavailable)
from ..padded import Padded, PaddedHandle
from ..result import Handle
from ..spec import FP8, CommSpec
from . import DEFAULT_WAIT_S
from . import nvshmem_runtime as rt
from .base import Backend, Received

_ops = torch.ops.moe_backend
# The ops' OpOverloads, resolved once: calling them skips OpOverloadPacket.__call__.
_dispatch_send = _ops.dispatch_send.default
_dispatch_recv = _ops.dispatch_recv.default
_dispatch_whole = _ops.dispatch_whole.default
_combine_send = _ops.combine_send.default
_combine_recv = _ops.combine_recv.default
_combine_whole = _ops.combine_whole.default
_pad_dispatch = _ops.pad_dispatch.default
_pad_recv = _ops.pad_recv.default
_pad_combine = _ops.pad_combine.default


class NvshmemBackend(Backend):
    name = "nvshmem"

    def __init__(
        self,
        spec: CommSpec,
        group: dist.ProcessGroup | None,
        device: torch.device,
        transport: str = "auto",
        timeout_s: float = DEFAULT_WAIT_S,
        sync_check: bool = False,
        num_sms: int | None = None,
        send_stream: bool = False,
    ):
        super().__init__(spec, group, device)
        if num_sms is not None and not (isinstance(num_sms, int) and num_sms >= 1):
            raise ValueError(f"num_sms must be a positive integer (SMs for the grids), got {num_sms!r}")
        if not isinstance(send_stream, bool):
            raise ValueError(f"send_stream must be True or False, got {send_stream!r}")
        if transport not in rt.TRANSPORTS:
            raise ValueError(f"transport must be one of {rt.TRANSPORTS}, got {transport!r}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        if spec.world_size > rt.MAX_WORLD:
            raise ValueError(f"the nvshmem backend supports up to {rt.MAX_WORLD} ranks, got {spec.world_size}")
        if spec.topk > rt.MAX_TOPK:
            raise ValueError(f"the nvshmem backend supports topk <= {rt.MAX_TOPK}, got {spec.topk}")
        if device.type != "cuda":
            raise ValueError(f"the nvshmem backend needs a CUDA device, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
            self.device = device
        self.sync_check = sync_check
        self.arena = rt.acquire(spec, transport, float(timeout_s), group, device, num_sms, send_stream)
        self.transport = self.arena.transport
        self._in_code = rt.dtype_code(spec.in_dtype)
        self._fp8 = spec.in_dtype == FP8
        self._ctx = self.arena.ctx

    @property
    def ctx(self) -> int:
        return self.arena.ctx

    def check_error(self) -> None:
        """Raise `RuntimeError` if a kernel of this arena timed out (no device sync)."""
        self.arena.check()

    def _after_recv(self) -> None:
        if self.sync_check and not torch.cuda.is_current_stream_capturing():
            torch.cuda.current_stream(self.device).synchronize()
        self.arena.check()

    @staticmethod
    def _split_n(num_tokens: int | torch.Tensor) -> tuple[torch.Tensor | None, int]:
        if isinstance(num_tokens, torch.Tensor):
            return num_tokens, 0
        return None, int(num_tokens)

    def _claim_arena(self) -> None:
        arena = self.arena
        arena.check()
        if arena.owner is not self:
            arena.claim(self)

    def dispatch_send(self, x, topk_ids, topk_weights, x_scale, num_tokens) -> Any:
        self._claim_arena()
        nt, nh = self._split_n(num_tokens)
        return _dispatch_send(x, topk_ids, topk_weights, x_scale, nt, nh, self._ctx), topk_weights is not None

    def dispatch_whole(self, x, topk_ids, topk_weights, x_scale, num_tokens) -> Any:
        # One launch where the direct receive runs (the extension falls back to send + receive
        # elsewhere): the pending state is the outputs, which dispatch_recv only collects.
        self._claim_arena()
        nt, nh = self._split_n(num_tokens)
        weighted = topk_weights is not None
        return _dispatch_whole(x, topk_ids, topk_weights, x_scale, nt, nh, self._ctx, self._in_code, weighted), weighted

    def dispatch_recv(self, pending) -> Received:
        sent, weighted = pending
        if isinstance(sent, list):  # dispatch_whole's outputs; the combine's dependency is one of them
            outs, dep = sent, sent[4]
        else:  # dispatch_send's dependency tensor
            outs, dep = _dispatch_recv(sent, self._ctx, self._in_code, weighted), sent
        tokens, scales, weights, tpe, offs, sg, st, sk = outs
        self._after_recv()
        return Received(
            tokens=tokens,
            scales=scales if self._fp8 else None,
            weights=weights if weighted else None,
            tokens_per_expert=tpe,
            expert_offsets=offs,
            src_group=sg,
            src_token=st,
            src_k=sk,
            backend_state=dep,
        )

    def _combine_inputs(self, expert_y: torch.Tensor, handle: Handle) -> tuple[torch.Tensor, torch.Tensor | None, int]:
        """The dispatch's dependency tensor and the token count (device tensor or host int)."""
        self.arena.check()
        dep = handle.backend_state if isinstance(handle.backend_state, torch.Tensor) else expert_y.new_empty(0)
        return (dep, *self._split_n(handle.num_tokens))

    def _combine_done(self, out: torch.Tensor) -> torch.Tensor:
        if self.arena.owner is self:
            self.arena.owner = None
        self._after_recv()
        return out

    def combine_send(self, expert_y, handle: Handle, weights, out) -> Any:
        dep, nt, nh = self._combine_inputs(expert_y, handle)
        # Also launches the receive into `out`, concurrently (unless overlap is off or it would
        # not fit beside the send); combine_recv then joins it.
        dep = _combine_send(expert_y, weights, dep, handle.topk_ids, nt, nh, out, self._ctx)
        return dep, handle.topk_ids, handle.num_tokens

    def combine_recv(self, pending, out: torch.Tensor) -> torch.Tensor:
        dep, topk_ids, num_tokens = pending
        nt, nh = self._split_n(num_tokens)
        _combine_recv(dep, topk_ids, nt, nh, out, self._ctx)
        return self._combine_done(out)

    def combine_whole(self, expert_y, handle: Handle, weights, out: torch.Tensor) -> torch.Tensor:
        # Send and receive from one host call (both on the caller's stream where the receive
        # would overlap the send and the call fills more than the side stream's receive grid, the
        # receive by PDL; otherwise the side stream).
        dep, nt, nh = self._combine_inputs(expert_y, handle)
        _combine_whole(expert_y, weights, dep, handle.topk_ids, nt, nh, out, self._ctx)
        return self._combine_done(out)

    def _padded_region(self) -> rt.PadRegion | None:
        self._claim_arena()
        return self.arena.padded()  # collective the first time

    def dispatch_padded(self, x, topk_ids, topk_weights, x_scale, num_tokens) -> Padded | None:
        # The padded kernels (csrc/padded_kernels.cuh): one launch, rows stored straight into their
        # slots at the expert's rank; None where they do not serve (the communicator derives it).
        region = self._padded_region()
        if region is None:
            return None
        nt, nh = self._split_n(num_tokens)
        counts, tpe = _pad_dispatch(x, topk_ids, topk_weights, x_scale, nt, nh, region.id, 3)
        return self._padded_received(region, counts, tpe, topk_weights is not None)

    def dispatch_padded_send(self, x, topk_ids, topk_weights, x_scale, num_tokens) -> Any:
        # The same kernel's send alone (it advances the round); dispatch_padded_recv waits.
        region = self._padded_region()
        if region is None:
            return None
        nt, nh = self._split_n(num_tokens)
        _pad_dispatch(x, topk_ids, topk_weights, x_scale, nt, nh, region.id, 1)
        return region, topk_ids, topk_weights is not None

    def dispatch_padded_recv(self, pending) -> Padded:
        region, like, weighted = pending
        counts, tpe = _pad_recv(like, region.id)
        return self._padded_received(region, counts, tpe, weighted)

    def _padded_received(self, region: rt.PadRegion, counts, tpe, weighted: bool) -> Padded:
        self._after_recv()
        return Padded(
            tokens=region.tokens,
            scales=region.scales if self._fp8 else None,
            weights=region.weights if weighted else None,
            counts=counts,
            tokens_per_expert=tpe,
            src_token=region.src_token,
            src_k=region.src_k,
            backend_state=region,
        )

    def combine_padded(self, expert_y, handle: PaddedHandle, weights, out: torch.Tensor) -> torch.Tensor:
        self.arena.check()
        nt, nh = self._split_n(handle.num_tokens)
        _pad_combine(expert_y, weights, handle.counts, handle.topk_ids, nt, nh, out, handle.backend_state.id)
        return self._combine_done(out)

    def close(self) -> None:
        arena, self.arena = self.arena, None
        self._ctx = 0
        if arena is not None:
            if arena.owner is self:
                arena.owner = None
            rt.release(arena)


# -- fake (meta) kernels: shapes for torch.compile ------------------------------------------
def _register_fakes() -> None:
    from torch.library import register_fake

    @register_fake("moe_backend::dispatch_send")
    def _(x, topk_ids, topk_weights, x_scale, num_tokens, n_host, ctx):
        return x.new_empty(0, dtype=torch.int32)

    @register_fake("moe_backend::dispatch_whole")
    def _(x, topk_ids, topk_weights, x_scale, num_tokens, n_host, ctx, in_dtype_code, weighted):
        return _recv_outputs(x, ctx, in_dtype_code, weighted)

    @register_fake("moe_backend::dispatch_recv")
    def _(dep, ctx, in_dtype_code, weighted):
        return _recv_outputs(dep, ctx, in_dtype_code, weighted)

    def _recv_outputs(dep, ctx, in_dtype_code, weighted):
        spec = rt.arena_for_ctx(ctx).spec
        R = spec.max_recv_tokens
        dt = [torch.bfloat16, torch.float16, torch.float32, FP8][in_dtype_code]
        e = lambda *s, d: dep.new_empty(s, dtype=d)  # noqa: E731
        L = spec.num_local_experts
        return [
            e(R, spec.hidden, d=dt), e(R, spec.num_scales, d=torch.float32), e(R if weighted else 0, d=torch.float32),
            e(L, d=torch.int64), e(L + 1, d=torch.int64), e(R, d=torch.int32), e(R, d=torch.int32),
            e(R, d=torch.int32),
        ]

    @register_fake("moe_backend::combine_send")
    def _(expert_y, weights, dep, topk_ids, num_tokens, n_host, out, ctx):
        return expert_y.new_empty(0, dtype=torch.int32)

    @register_fake("moe_backend::combine_recv")
    def _(dep, topk_ids, num_tokens, n_host, out, ctx):
        return None

    @register_fake("moe_backend::pad_dispatch")
    def _(x, topk_ids, topk_weights, x_scale, num_tokens, n_host, pad, phase):
        if phase == 1:
            return []
        L, G = _pad_shape(pad)
        return [x.new_empty(L, G, dtype=torch.int32), x.new_empty(L, dtype=torch.int64)]

    @register_fake("moe_backend::pad_recv")
    def _(like, pad):
        L, G = _pad_shape(pad)
        return [like.new_empty(L, G, dtype=torch.int32), like.new_empty(L, dtype=torch.int64)]

    @register_fake("moe_backend::pad_combine")
    def _(expert_y, weights, counts, topk_ids, num_tokens, n_host, out, pad):
        return None

    @register_fake("moe_backend::combine_whole")
    def _(expert_y, weights, dep, topk_ids, num_tokens, n_host, out, ctx):
        return None


def _pad_shape(pad: int) -> tuple[int, int]:
    for arena in rt._ARENAS.values():
        region = arena.padded() if arena._pad else None
        if region is not None and region.id == pad:
            return region.tokens.shape[0], arena.spec.num_groups
    raise ValueError(f"no padded region {pad}")


try:
    _register_fakes()
except Exception:  # pragma: no cover - older torch without register_fake
    pass
