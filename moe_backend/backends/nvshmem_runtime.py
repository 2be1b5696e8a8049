"""NVSHMEM bootstrap and the process-wide symmetric buffer arena of the `nvshmem` backend.

Importable without the native extension: `buffer_bytes(spec)` / `layout(spec)` are the one
place the buffer sizes are defined (docs/KERNELS.md explains every region), so
`moe-backend info` can print them on a CPU machine. Everything that touches NVSHMEM
imports `moe_backend._C` lazily.

Lifetime: NVSHMEM is initialised once per process (nvshmem4py with a unique id broadcast
over torch.distributed, then the extension registers its device state). Arenas are keyed
by (spec, transport, timeout, ranks, device, num_sms, send_stream); every communicator with the same key shares one
(layers, micro-batches) as long as their rounds do not interleave (checked). An arena is
freed, collectively, when the last communicator using it is closed, or by `shutdown()`.
Nothing collective runs at interpreter exit (a peer may already be gone): the driver
releases the memory with the process.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from ..spec import FP8, CommSpec
from .nvshmem_env import check_env

TRANSPORTS = ("auto", "put", "nvlink")
MAX_WORLD = 64
MAX_TOPK = 64
_ALIGN = 256
DIRECT_TABLE_BYTES = 8192  # the kernels' TABLE_PORTION_BYTES: the direct receive's table fits one portion
PHASES = {1: "dispatch_recv", 2: "combine_recv", 3: "dispatch_recv (grid barrier)"}

_DTYPE_CODE = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2, FP8: 3}


def _up(x: int, a: int = 16) -> int:
    return (x + a - 1) // a * a


def _decode_sized(spec: CommSpec) -> bool:
    """An arena whose table fits the direct receive's one portion (the decode arenas)."""
    return spec.max_num_tokens * spec.topk * 8 <= DIRECT_TABLE_BYTES


def has_tagged_room(spec: CommSpec, transport: str) -> bool:
    """Whether the arena can hold round-tagged rows (LL_ROWS) and partials (tagged_partials):
    nvlink arenas of the decode size (put's with PUT_TAGGED=1 hold tagged partials, never rows)."""
    return transport == "nvlink" and _decode_sized(spec)


def put_tagged() -> bool:
    """Whether put arenas send tagged partials too (MOE_BACKEND_NVSHMEM_PUT_TAGGED=1, round 63;
    default 0): staged, then put with no signal, as put's tagged table (round 26). A tagged word
    is whole at the receiver where the fabric writes aligned 8-byte words whole (P2P stores do;
    over IB or EFA validate with the contract suite first)."""
    raw = os.environ.get("MOE_BACKEND_NVSHMEM_PUT_TAGGED", "")
    if raw not in ("", "0", "1"):
        raise ValueError(f"MOE_BACKEND_NVSHMEM_PUT_TAGGED must be 0 or 1, got {raw!r}")
    return raw == "1"


def row_sizes(spec: CommSpec, transport: str) -> dict[str, int]:
    """Bytes of one dispatch slot (x row + fp8 scales), one routing table, one combine partial."""
    row = spec.hidden * spec.in_dtype.itemsize
    scale = spec.num_scales * 4
    # nvlink arenas whose table fits the direct receive's one portion have room for the rows in
    # round-tagged words too (twice the bytes; LL_ROWS, round 38; put never tags its rows).
    tagged = 2 if has_tagged_room(spec, transport) else 1
    return {
        "row_bytes": row,
        "scale_bytes": scale,
        "slot_bytes": (_up(row) + _up(scale)) * tagged,
        # Room for the direct receive's round-tagged table (round 25): a 16-byte header, 16 bytes
        # per (token, k), 8 per expert count; the untagged table (8 per (token, k), 4 per count)
        # takes the first half.
        "table_bytes": _up(16 + spec.max_num_tokens * spec.topk * 16 + spec.num_experts * 8),
        "part_bytes": _up(spec.hidden * spec.transfer_dtype.itemsize),
    }


def layout(spec: CommSpec, transport: str = "put") -> dict[str, int]:
    """Offsets (`off_*`) and sizes of the symmetric arena regions, and its total size.

    W ranks, G groups, M max tokens, per rank:
      signals   8 * (W arrive + G table + G*M token + W barrier + W * combine_flags_per_rank(spec) partial) flags
      tables    G * table_bytes           (16-byte header, then per token ids[topk] int32, weights[topk] f32,
                                           then count[E] int32, written by the direct receive's senders;
                                           or all of it in round-tagged 8-byte words, twice the bytes)
      dispatch  G * M * slot_bytes        (slot [g][t]: x row, 16-aligned, then fp8 scales; twice
                                           that in nvlink arenas with room for round-tagged rows)
      combine   W * M * part_bytes        (slot [r][t]: partial in the transfer dtype; then, in arenas
                                           whose partials may go as round-tagged words, 2 * W * T *
                                           part_bytes for those, T = tagged_partials(): M or fewer)
      staging   put transport only: M * slot_bytes + table_bytes + G * M * part_bytes, then the
                tagged partials' staging, 2 * G * T * part_bytes
    """
    if transport not in ("put", "nvlink"):
        raise ValueError(f"transport must be 'put' or 'nvlink' here, got {transport!r}")
    W, G, M = spec.world_size, spec.num_groups, spec.max_num_tokens
    s = row_sizes(spec, transport)
    T = tagged_partials(spec, transport)
    sizes = {
        "signals": 8 * (2 * W + G + G * M + W * combine_flags_per_rank(spec)),
        "tables": G * s["table_bytes"],
        "dispatch": G * M * s["slot_bytes"],
        "combine": W * M * s["part_bytes"] + 2 * W * T * s["part_bytes"],
        "stage_disp": M * s["slot_bytes"] if transport == "put" else 0,
        "stage_table": s["table_bytes"] if transport == "put" else 0,
        "stage_comb": (G * M + 2 * G * T) * s["part_bytes"] if transport == "put" else 0,
    }
    out: dict[str, int] = {}
    off = 0
    for name, size in sizes.items():
        out[f"off_{name}"] = off
        out[name] = size
        off += _up(size, _ALIGN)
    out["symmetric_total"] = off
    return out


def buffer_bytes(spec: CommSpec, transport: str = "put") -> dict[str, int]:
    """Bytes per rank of every buffer the nvshmem backend allocates for `spec`.

    Symmetric (NVSHMEM heap, per rank): signals, tables, dispatch, combine, staging (put
    transport only); `symmetric_total` is their sum with alignment. Local device memory:
    `rowmap` (G*M*topk int32, the received row of every (token, k)), chunk counters, state.
    """
    lay = layout(spec, "put" if transport == "auto" else transport)
    chunks = max(1, -(-spec.num_groups * spec.max_num_tokens // 32))  # upper bound
    local = spec.num_groups * spec.max_num_tokens * spec.topk * 4 + chunks * spec.num_local_experts * 4 + 64
    return {
        "signals": lay["signals"],
        "tables": lay["tables"],
        "dispatch": lay["dispatch"],
        "combine": lay["combine"],
        "staging": lay["stage_disp"] + lay["stage_table"] + lay["stage_comb"],
        "symmetric_total": lay["symmetric_total"],
        "local_total": local,
    }


# Combine work items: each call cuts a token's partial into S slices of H (each a warp's work,
# with its own flag) until it has about COMBINE_ITEMS items, S from the call's largest token
# count (the kernels' call_slices), so a small batch still spreads over many warps (one warp
# per 14 KB row was latency-bound: ~20 us for a single token). S = 1 at prefill sizes.
# MOE_BACKEND_NVSHMEM_COMBINE_ITEMS overrides it (for A/B runs; every rank must agree).
_COMBINE_ITEMS = 1024


def combine_items() -> int:
    """The combine's target work items per call (MOE_BACKEND_NVSHMEM_COMBINE_ITEMS, default 1024)."""
    raw = os.environ.get("MOE_BACKEND_NVSHMEM_COMBINE_ITEMS", "")
    if not raw:
        return _COMBINE_ITEMS
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"MOE_BACKEND_NVSHMEM_COMBINE_ITEMS must be a positive integer, got {raw!r}")
    return int(raw)


# Arenas of at most this many tokens (max_num_tokens) send their combine partials in round-tagged
# words that the receive polls, with no flag (nvlink arenas with room for them: has_tagged_room;
# the kernels' TAGGED instances, round 49). Twice a partial's bytes over the link, so small calls
# only: at EP2 a 128-token call's partials would take ~5 us more of it, a 32-token call's ~1.3.
# Larger arenas with the room choose per call (round 59, the BY_CALL instances): a call whose
# round's largest token count is at most this many tags its partials (run 43 at EP2, the 128-token
# arena tagged for every call: combine 1 / 32 / 128 tokens 9.2 / 12.4 / 23.1 us against 10.7 / 14.0
# / 20.4 plain). MOE_BACKEND_NVSHMEM_LL_COMBINE=k overrides it (0 turns it off; every rank must
# agree); MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL=0 keeps the larger arenas plain.
_LL_COMBINE_TOKENS = 32
# The same for the dispatch's rows (round 38's LL_ROWS: the kernels' ROWS instances, no token flag),
# by default since round 51 in arenas of at most this many tokens (twice a row's bytes over the link:
# at EP2 a 32-token call's rows take ~0.6 us more of it, a 128-token call's ~2.4);
# MOE_BACKEND_NVSHMEM_LL_ROWS=k overrides it (0 turns it off; every rank must agree).
_LL_ROWS_TOKENS = 32


def _token_count(name: str, default: int) -> int:
    """A token count from the environment variable `name` (digits; 0 turns its feature off)."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    if not raw.isdigit() or len(raw) > 9:
        raise ValueError(f"{name} must be a token count (0 turns it off), got {raw!r}")
    return int(raw)


def ll_combine_tokens() -> int:
    """The largest arena (max_num_tokens) whose combine partials go as round-tagged words
    (MOE_BACKEND_NVSHMEM_LL_COMBINE, default 32; 0: none)."""
    return _token_count("MOE_BACKEND_NVSHMEM_LL_COMBINE", _LL_COMBINE_TOKENS)


def ll_rows_tokens() -> int:
    """The largest arena (max_num_tokens) whose dispatch rows go as round-tagged words
    (MOE_BACKEND_NVSHMEM_LL_ROWS, default 32; 0: none)."""
    return _token_count("MOE_BACKEND_NVSHMEM_LL_ROWS", _LL_ROWS_TOKENS)


def ll_combine_by_call() -> bool:
    """Whether arenas of more than ll_combine_tokens() tokens with the room tag a call's partials
    when its round's largest token count is at most that (MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL,
    default 1; 0: such arenas never tag)."""
    raw = os.environ.get("MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL", "")
    if raw not in ("", "0", "1"):
        raise ValueError(f"MOE_BACKEND_NVSHMEM_LL_COMBINE_BY_CALL must be 0 or 1, got {raw!r}")
    return raw != "0"


def tagged_partials(spec: CommSpec, transport: str) -> int:
    """The tokens of the arena's round-tagged partials region (its rows per rank), 0 for none:
    decode-sized nvlink arenas (put's too with put_tagged()) whose rows are whole 16-byte vectors
    (hidden % 8 == 0). An arena of at most ll_combine_tokens() tokens tags every call's partials
    (the kernels' EVERY instances; the region holds max_num_tokens rows); a larger one the calls of
    at most that many tokens (BY_CALL instances; ll_combine_tokens() rows), unless
    ll_combine_by_call() is off."""
    limit = ll_combine_tokens()  # read (and a bad value refused) on every transport, as tagged_rows
    by_call = ll_combine_by_call()
    room = _decode_sized(spec) and (transport == "nvlink" or (transport == "put" and put_tagged()))
    if limit == 0 or not room or spec.hidden % 8 != 0:
        return 0
    if spec.max_num_tokens <= limit:
        return spec.max_num_tokens
    return limit if by_call else 0


def tagged_rows(spec: CommSpec, transport: str) -> bool:
    """Whether the arena may send its dispatch rows as round-tagged words (the kernels' ROWS
    instances, which also need the tagged table and rows and scales of whole 16-byte vectors):
    nvlink arenas with room for them (their slots are twice a row) of at most ll_rows_tokens() tokens."""
    limit = ll_rows_tokens()  # read (and a bad value refused) on every transport
    return has_tagged_room(spec, transport) and spec.max_num_tokens <= limit


def combine_flags_per_rank(spec: CommSpec) -> int:
    """Partial flags per source rank: S flags for each of a call's tokens, S * tokens <=
    max(M, COMBINE_ITEMS / G) (the kernels' comb_flags_per_rank)."""
    return max(spec.max_num_tokens, combine_items() // spec.num_groups)


# Source tokens (groups x max_num_tokens) an arena takes per SM of its kernels' num_sms: the
# dispatch receive's plan block holds one chunk of at most this many tokens, one block per SM.
MAX_SOURCES_PER_SM = 1024


def chunking(spec: CommSpec, num_sms: int) -> tuple[int, int]:
    """(tokens per block, blocks) of the dispatch-receive kernel: at most one block per SM."""
    tokens = spec.num_groups * spec.max_num_tokens
    chunk = min(MAX_SOURCES_PER_SM, 32 * -(-tokens // (32 * num_sms)))
    nchunks = -(-tokens // chunk)
    if nchunks > num_sms:
        raise ValueError(
            f"num_groups*max_num_tokens={tokens} exceeds {num_sms * MAX_SOURCES_PER_SM} "
            f"({MAX_SOURCES_PER_SM} per SM) for the nvshmem backend"
        )
    return chunk, nchunks


# ---------------------------------------------------------------------------------------
# Bootstrap
_lock = threading.RLock()
_init: dict[str, Any] = {}  # ranks (global ranks in PE order), method, nvlink cache


def ops():
    from .. import _C  # noqa: F401  (registers torch.ops.moe_backend)

    return torch.ops.moe_backend


def _global_ranks(group: dist.ProcessGroup | None) -> list[int]:
    if group is None:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def _set_env_defaults(group: dist.ProcessGroup | None) -> None:
    """NVSHMEM env defaults, only where the user set nothing: single node => P2P only."""
    if "NVSHMEM_REMOTE_TRANSPORT" in os.environ:
        return
    hosts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    if len(set(hosts)) == 1:
        os.environ["NVSHMEM_REMOTE_TRANSPORT"] = "none"


def ensure_initialised(group: dist.ProcessGroup | None, device: torch.device) -> list[int]:
    """Initialise NVSHMEM once (collective over `group` the first time); return PE of each group rank."""
    with _lock:
        ranks = _global_ranks(group)
        if "ranks" not in _init:
            _set_env_defaults(group)
            torch.cuda.set_device(device)
            o = ops()
            rank, n = dist.get_rank(group), len(ranks)
            method = os.environ.get("MOE_BACKEND_NVSHMEM_BOOTSTRAP", "nvshmem4py")
            if method == "nvshmem4py":
                try:
                    import nvshmem.core as nvshmem_core

                    try:
                        from cuda.core import Device
                    except ImportError:
                        from cuda.core.experimental import Device
                except ImportError:
                    method = "native"
            if method == "nvshmem4py":
                uid = nvshmem_core.get_unique_id(empty=rank != 0)
                box = [uid]
                dist.broadcast_object_list(box, src=ranks[0], group=group)
                dev = Device(device.index)
                dev.set_current()
                nvshmem_core.init(device=dev, uid=box[0], rank=rank, nranks=n, initializer_method="uid")
                o.register_module()  # registers this module's device state with the running host lib
            else:
                uid = o.get_uid() if rank == 0 else None
                box = [None if uid is None else bytes(uid.tolist())]
                dist.broadcast_object_list(box, src=ranks[0], group=group)
                o.init_uid(torch.tensor(list(box[0]), dtype=torch.uint8), rank, n)
            if o.n_pes() != n:
                raise RuntimeError(f"NVSHMEM started with {o.n_pes()} PEs, expected {n}")
            _init.update(ranks=ranks, method=method, sms=int(o.num_sms(device.index)))
        base = _init["ranks"]
        missing = [r for r in ranks if r not in base]
        if missing:
            raise RuntimeError(
                f"NVSHMEM was initialised over global ranks {base}; ranks {missing} are not in it "
                "(create the first nvshmem communicator on the largest group)"
            )
        return [base.index(r) for r in ranks]


def sym_malloc(nbytes: int, what: str) -> int:
    """`nbytes` of NVSHMEM's symmetric heap (collective); a failure names the heap's size switch."""
    try:
        return int(ops().sym_malloc(nbytes))
    except RuntimeError as err:
        raise RuntimeError(
            f"{err}: {what} needs {nbytes:,} bytes of NVSHMEM's symmetric heap a rank; the heap is "
            "NVSHMEM_SYMMETRIC_SIZE (default 1 GiB, set before NVSHMEM starts; `moe-backend info --config "
            "PRESET` prints each arena's size)"
        ) from err


@contextmanager
def peer_scratch(device: torch.device, nbytes: int) -> Iterator[tuple[int, list[int] | None]]:
    """A zeroed symmetric buffer of `nbytes` for the benchmark's probes: (its local address, its
    address at every PE in rank order, or None where some rank cannot reach some peer through
    nvshmem_ptr). Collective on entry and exit (every rank of the world)."""
    pes = ensure_initialised(None, device)
    o = ops()
    buf = sym_malloc(nbytes, "the probes' scratch")  # collective
    try:
        peers = [int(o.peer_ptr(buf, pe)) for pe in pes]
        reachable = torch.tensor([1 if all(peers) else 0], device=device)
        dist.all_reduce(reachable, op=dist.ReduceOp.MIN)
        yield buf, (peers if reachable.item() else None)
    finally:
        torch.cuda.synchronize(device)
        dist.barrier()
        o.sym_free(buf)  # collective


# ---------------------------------------------------------------------------------------
# Arena
class Arena:
    """Symmetric + local buffers and the kernels' context for one (spec, transport)."""

    def __init__(self, key, spec: CommSpec, transport: str, timeout_s: float, pes: list[int], rank: int,
                 device: torch.device, sms: int, send_stream: bool = False):
        check_env()  # the kernels' variables, before anything is loaded or allocated
        o = ops()
        self.key, self.spec, self.transport, self.timeout_s, self.device = key, spec, transport, timeout_s, device
        self.layout = layout(spec, transport)  # a bad LL_COMBINE raises here, before the collective allocation
        rows_tagged = tagged_rows(spec, transport)  # a bad LL_ROWS too
        what = f"the arena of {spec.describe()} ({transport})"
        self.sym = sym_malloc(self.layout["symmetric_total"], what)  # collective
        peers = [int(o.peer_ptr(self.sym, pe)) for pe in pes]
        if transport == "nvlink" and not all(peers):
            o.sym_free(self.sym)
            raise RuntimeError("transport 'nvlink' needs every peer reachable by nvshmem_ptr (P2P); use 'put'")
        self.chunk, self.nchunks = chunking(spec, sms)
        L = spec.num_local_experts
        self.state = torch.zeros(16, dtype=torch.int64, device=device)  # see Params::state in csrc
        self.cnt = torch.zeros(self.nchunks * L, dtype=torch.int32, device=device)
        self.rowmap = torch.full((spec.num_groups * spec.max_num_tokens * spec.topk,), -1, dtype=torch.int32,
                                 device=device)
        self.err = torch.zeros(4, dtype=torch.int32, pin_memory=True)
        self._err_flag = self.err.numpy()  # numpy view of the pinned word: ~0.1 us to read vs ~1.3 us for err[0]
        s = row_sizes(spec, transport)
        out_code = _DTYPE_CODE[spec.out_dtype]
        lay = self.layout
        cfg = [
            spec.world_size, spec.num_groups, spec.tp_size, rank,
            spec.num_experts, L, spec.topk, spec.hidden, spec.max_num_tokens,
            s["row_bytes"], s["scale_bytes"], s["slot_bytes"], s["table_bytes"], s["part_bytes"],
            out_code, _DTYPE_CODE[spec.transfer_dtype],
            self.chunk, self.nchunks, sms, 1 if transport == "nvlink" else 0,
            int(timeout_s * 1e9), combine_items(), tagged_partials(spec, transport),
            int(rows_tagged), int(send_stream),
            self.sym,
            lay["off_signals"], lay["off_tables"], lay["off_dispatch"], lay["off_combine"],
            lay["off_stage_disp"], lay["off_stage_table"], lay["off_stage_comb"],
            self.state.data_ptr(), self.cnt.data_ptr(), self.rowmap.data_ptr(),
            self.err.data_ptr(),
            *pes, *peers,
        ]
        self.ctx = int(o.create_ctx(cfg))
        _CTX[self.ctx] = self
        self.refs = 0
        self._pad: PadRegion | bool | None = None  # None: not asked for yet; False: unsupported
        self.owner: Any = None
        self.broken: str | None = None
        torch.cuda.synchronize(device)

    # -- errors ----------------------------------------------------------------------
    def check(self) -> None:
        """Raise if a kernel recorded a timeout (reads pinned host memory: no device sync)."""
        if self.broken is None and self._err_flag[0] != 0:
            phase, peer, rnd = (int(v) for v in self.err[1:4].tolist())
            who = f"rank {peer}" if peer >= 0 else "the other blocks of the kernel"
            self.broken = (
                f"nvshmem backend: {PHASES.get(phase, phase)} timed out after {self.timeout_s} s waiting for "
                f"{who} (round {rnd}); did every rank call the same sequence of dispatch/combine? "
                "This arena is unusable; close the communicator and create a new one."
            )
        if self.broken is not None:
            raise RuntimeError(self.broken)

    def claim(self, owner: Any) -> None:
        if self.owner is not None and self.owner is not owner:
            raise RuntimeError(
                "another communicator with the same spec is between its dispatch and combine; communicators "
                "sharing buffers must not interleave rounds"
            )
        self.owner = owner

    def padded(self) -> PadRegion | None:
        """The padded layout's region and kernels (allocated collectively by every rank's first
        `dispatch_padded`), or None where they do not serve this arena (`padded_unsupported`)."""
        if self._pad is None:
            if padded_unsupported(self.spec, self.transport) is not None:
                self._pad = False
            else:
                self._pad = PadRegion(self)
        return self._pad or None

    def free(self) -> None:
        o = ops()
        if self._pad:
            self._pad.free()
            self._pad = None
        _CTX.pop(self.ctx, None)
        o.sym_free(self.sym)  # collective
        o.destroy_ctx(self.ctx)
        self.ctx = 0


# The padded kernels' token masks (E * ceil(M / 32) words) live in one block's shared memory.
PAD_MASK_BYTES = 200 * 1024


def padded_unsupported(spec: CommSpec, transport: str) -> str | None:
    """Why the padded kernels do not serve this arena (the communicator then derives the padded
    layout from the contiguous dispatch), or None where they do."""
    raw = os.environ.get("MOE_BACKEND_NVSHMEM_PADDED", "")
    if raw not in ("", "0", "1"):
        raise ValueError(f"MOE_BACKEND_NVSHMEM_PADDED must be 0 or 1, got {raw!r}")
    if raw == "0":
        return "MOE_BACKEND_NVSHMEM_PADDED=0"
    if transport != "nvlink":
        return "the padded kernels store into peers' memory: nvlink transport only"
    if spec.topk > 32:
        return "topk > 32"
    if (spec.hidden * spec.in_dtype.itemsize) % 16 or (spec.hidden * spec.out_dtype.itemsize) % 16:
        return "rows that are not multiples of 16 bytes"
    if spec.num_experts * -(-spec.max_num_tokens // 32) * 4 > PAD_MASK_BYTES:
        return "token masks past shared memory (num_experts * max_num_tokens too large)"
    return None


def padded_partials() -> bool:
    """The padded combine sums each source token's rows on the expert's rank into one partial, sent
    as round-tagged words (rounds 66-67; on by default since run 47: 7.8 / 8.3 / 16.4 us at 1 / 32 /
    128 tokens against 12.6 / 15.7 / 26.9, DeepSeek decode at world size 1 on an H100);
    MOE_BACKEND_NVSHMEM_PADDED_PARTIALS=0 sends every slot's row back behind a flag instead."""
    raw = os.environ.get("MOE_BACKEND_NVSHMEM_PADDED_PARTIALS", "")
    if raw not in ("", "0", "1"):
        raise ValueError(f"MOE_BACKEND_NVSHMEM_PADDED_PARTIALS must be 0 or 1, got {raw!r}")
    return raw != "0"


def _pad_f32_transfer(spec: CommSpec) -> bool:
    """The padded combine rounds its partials to float32, not out_dtype (combine_in_float32)."""
    return spec.transfer_dtype == torch.float32 and spec.out_dtype != torch.float32


def padded_region_bytes(spec: CommSpec, partials: bool | None = None) -> int:
    """Symmetric bytes a rank of the padded layout's region (csrc/padded_ops.cuh's pad_layout,
    restated: `moe-backend info` prints it, a GPU test checks it against the kernels' own):
    L * G * M slots (row, scales, weight, source), L * W count words, M * topk combine rows,
    weights and flags, and with PADDED_PARTIALS each token's slots and W * M tagged partials."""
    partials = padded_partials() if partials is None else partials
    up = lambda v: -(-v // 16) * 16  # noqa: E731
    slots = spec.num_local_experts * spec.num_groups * spec.max_num_tokens
    places = spec.max_num_tokens * spec.topk
    out_bytes = spec.hidden * spec.out_dtype.itemsize
    part_bytes = spec.hidden * 4 if _pad_f32_transfer(spec) else out_bytes
    parts = [slots * spec.hidden * spec.in_dtype.itemsize, slots * spec.num_scales * 4, slots * 4, slots * 8,
             spec.num_local_experts * spec.world_size * 8, places * out_bytes, places * 4, places * 8,
             places * spec.num_groups * 8 if partials else 0,
             spec.world_size * spec.max_num_tokens * 2 * part_bytes if partials else 0]
    return sum(up(v) for v in parts)


class PadRegion:
    """The padded layout's symmetric region (receive slots, count words, the combine's rows and
    flags), its kernels' context, and the receive slots as tensors (views of the region)."""

    def __init__(self, arena: Arena):
        o = ops()
        spec = arena.spec
        L, slots = spec.num_local_experts, spec.num_groups * spec.max_num_tokens
        self.state = torch.zeros(2 + spec.num_experts, dtype=torch.int64, device=arena.device)
        cfg = [spec.hidden * spec.in_dtype.itemsize, spec.num_scales * 4, spec.hidden * spec.out_dtype.itemsize,
               int(_pad_f32_transfer(spec)), self.state.data_ptr(),
               int(padded_partials())]
        nbytes = self.bytes = int(o.pad_region_bytes(arena.ctx, cfg))
        self.sym = sym_malloc(nbytes, f"the padded layout of {spec.describe()}")  # collective
        self.id = int(o.pad_create(arena.ctx, self.sym, cfg))
        tok, scale, weights, meta = o.pad_views(self.id, arena.device.index)
        self.tokens = tok.view(spec.in_dtype).view(L, slots, spec.hidden)
        self.scales = scale.view(L, slots, spec.num_scales)
        self.weights = weights.view(L, slots)
        self.src_token = meta[:, 0].view(L, slots)
        self.src_k = meta[:, 1].view(L, slots)

    def free(self) -> None:
        o = ops()
        o.pad_destroy(self.id)
        o.sym_free(self.sym)  # collective


_CTX: dict[int, Arena] = {}
_ARENAS: dict[Any, Arena] = {}


def nvlink_reachable(pes: list[int]) -> bool:
    """Whether every PE's symmetric memory is load/store reachable (nvshmem_ptr non-null)."""
    key = tuple(pes)
    cache = _init.setdefault("nvlink", {})
    if key not in cache:
        o = ops()
        probe = _init.get("probe")
        if probe is None:
            probe = _init["probe"] = int(o.sym_malloc(256))  # collective, once per process
        cache[key] = all(int(o.peer_ptr(probe, pe)) for pe in pes)
    return cache[key]


def acquire(spec: CommSpec, transport: str, timeout_s: float, group: dist.ProcessGroup | None,
            device: torch.device, num_sms: int | None = None, send_stream: bool = False) -> Arena:
    """The shared arena for this key, allocating it (collectively) the first time.

    num_sms: SMs the kernels size their grids for (None: every SM of the device);
    send_stream: the dispatch send kernel runs on a stream of its own (overlap only).
    """
    with _lock:
        pes = ensure_initialised(group, device)
        if num_sms is not None and num_sms > _init["sms"]:
            raise ValueError(f"num_sms={num_sms} exceeds the device's {_init['sms']} SMs")
        sms = num_sms or _init["sms"]
        if transport == "auto":
            transport = "nvlink" if nvlink_reachable(pes) else "put"
        key = (spec, transport, float(timeout_s), tuple(_global_ranks(group)), str(device), sms, send_stream)
        arena = _ARENAS.get(key)
        if arena is None or arena.broken is not None:
            arena = Arena(key, spec, transport, timeout_s, pes, dist.get_rank(group), device, sms, send_stream)
            _ARENAS[key] = arena
        arena.refs += 1
        return arena


def release(arena: Arena) -> None:
    """Drop one user; the last one frees the arena (collective: same order on every rank)."""
    with _lock:
        arena.refs -= 1
        if arena.refs <= 0 and arena.ctx:
            if _ARENAS.get(arena.key) is arena:
                del _ARENAS[arena.key]
            arena.free()


def shutdown() -> None:
    """Free every arena and finalise NVSHMEM (collective; call on every rank, or never)."""
    with _lock:
        for arena in list(_ARENAS.values()):
            arena.free()
        _ARENAS.clear()
        if "ranks" in _init:
            o = ops()
            if "probe" in _init:
                o.sym_free(_init.pop("probe"))
            if _init.get("method") == "nvshmem4py":
                import nvshmem.core as nvshmem_core

                nvshmem_core.finalize()
            _init.clear()


def arena_for_ctx(ctx: int) -> Arena:
    return _CTX[ctx]


def dtype_code(dtype: torch.dtype) -> int:
    return _DTYPE_CODE[dtype]
