"""Dispatch/combine benchmark: per phase and whole ops, against baselines from the same run.

Method (the same on every backend): random routing with distinct experts per token; before
each op a barrier (on GPU: a short device sleep, then a one-element all-reduce, so every
rank starts together without a host round trip); CUDA events (host clock on CPU) around
each phase; per rank the median/p10/p90 over the iterations, then the max over ranks.
Baselines measured in the same run: NCCL/gloo dense `all_to_all_single` of the same
`[tokens * topk, hidden]` payload, and on GPU the raw GPU-to-GPU copy rate.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .backends import nvshmem_available
from .backends.nvshmem_runtime import padded_region_bytes
from .communicator import Communicator
from .config import WARM_CONTROLS, BenchPreset
from .spec import FP8, CommSpec

# The split phases (each call timed on its own), then the whole ops as a user calls them
# (`comm.dispatch`, `comm.combine`: a backend may fuse send and receive), then the split
# phases' sums, then the padded layout's whole ops (`comm.dispatch_padded`, `comm.combine_padded`)
# where their region fits PADDED_BENCH_BYTES.
PHASES = ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv", "dispatch", "combine",
          "dispatch_split", "combine_split", "dispatch_padded", "combine_padded")
# The padded layout's slots (L * G * M rows) are NVSHMEM symmetric memory: decode sizes only
# (DeepSeek decode, 128 tokens a rank: ~0.26 GB; prefill's 4096 would take ~8 GB).
PADDED_BENCH_BYTES = 768 << 20


def padded_fits(spec: CommSpec) -> bool:
    """Whether the bench times the padded ops: their region (the nvshmem backend's, per rank) fits."""
    return padded_region_bytes(spec) <= PADDED_BENCH_BYTES


class Clock:
    """Marks on the device timeline (CUDA events) or the host clock (CPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def elapsed_us(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) * 1e3 if self.cuda else (b - a) * 1e6

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


# Inputs larger than this are not warmed (the padded combine's whole stand-in output: L * G * M
# rows; its filled rows are warmed in place by `touch_padded_filled_rows`).
WARM_MAX_BYTES = 64 << 20


def padded_filled_index(counts: torch.Tensor, slots: int) -> torch.Tensor:
    """The flat row numbers (slot (l * G + g) * M + i, ascending) below each (expert, group)'s count
    `counts [L, G]` in a padded layout of `slots` (M) rows a pair: what a masked grouped GEMM
    writes before the padded combine."""
    filled = torch.arange(slots, device=counts.device) < counts.unsqueeze(-1)  # [L, G, M]
    return filled.reshape(-1).nonzero().squeeze(1)


def touch_padded_filled_rows(y: torch.Tensor, counts: torch.Tensor, mode: str) -> None:
    """`--warm-inputs` for the padded combine (`mode` as `touch`'s; "" does nothing): each filled
    row of `y [L, G * M, hidden]` read and written back in place (plus zero), as the expert GEMM
    leaves them: in L2, dirty. Gathering them instead would add a second copy's dirty lines for the
    combine's stores to evict (the whole `y` is hundreds of MB at decode sizes, past
    WARM_MAX_BYTES). The controls touch a scratch buffer instead (`control_touch`)."""
    if not mode:
        return
    flat = y.view(-1, y.shape[-1])
    if mode in WARM_CONTROLS:  # the rows' bytes alone: no index to build
        control_touch(y.device, int(counts.sum()) * flat.shape[1] * flat.element_size(), mode)
        return
    idx = padded_filled_index(counts.to(y.device), y.shape[1] // counts.shape[1])
    flat.index_add_(0, idx, flat.new_zeros(1, flat.shape[1]).expand(idx.numel(), -1))


_scratch: dict[tuple[torch.device, int], torch.Tensor] = {}


def scratch_bytes(device: torch.device, nbytes: int) -> torch.Tensor:
    """A bytes buffer of nbytes (at least one) on device, made once per size: what the controls
    (`--warm-by scratch` / `launch` / `fill`) touch instead of an input."""
    key = (device, max(nbytes, 1))
    if key not in _scratch:
        _scratch[key] = torch.ones(key[1], dtype=torch.uint8, device=device)
    return _scratch[key]


# `--warm-by launch` / `launch-out` / `fill` touch this many bytes a call: the touching kernels run,
# next to nothing swept.
LAUNCH_CONTROL_BYTES = 16


def control_touch(device: torch.device, nbytes: int, mode: str) -> None:
    """A control's touch of an input of nbytes: "scratch" reads a scratch buffer of that size,
    "launch" one of LAUNCH_CONTROL_BYTES (a reduction kernel still, next to nothing swept),
    "launch-out" the same reduction into a one-byte output made once (the kernel without an output
    tensor from the caching allocator), "fill" fills one of LAUNCH_CONTROL_BYTES with ones, its
    bits unchanged (an elementwise kernel: no reduction, no output tensor from the allocator)."""
    if mode == "fill":
        scratch_bytes(device, LAUNCH_CONTROL_BYTES).fill_(1)
        return
    if mode == "launch-out":
        torch.amax(scratch_bytes(device, LAUNCH_CONTROL_BYTES), dim=0, out=scratch_bytes(device, 1)[0])
        return
    scratch_bytes(device, nbytes if mode == "scratch" else LAUNCH_CONTROL_BYTES).amax()


def touch(t: torch.Tensor, mode: str) -> None:
    """One warm input: "read" reads it once (a reduction); "write" rewrites it in place with its
    bits unchanged (OR of zero), leaving its lines dirty in L2 as the kernel that made it would;
    "scratch" reads a buffer of its size instead (the read's kernel, the input left cold), "launch"
    one of LAUNCH_CONTROL_BYTES, "launch-out" that into a given output, "fill" fills one
    (`control_touch`)."""
    if mode in WARM_CONTROLS:
        control_touch(t.device, t.numel() * t.element_size(), mode)
    elif mode == "write" and t.is_contiguous():
        t.view(-1).view(torch.uint8).bitwise_or_(0)
    else:  # a strided input (none of the bench's) is read through a contiguous copy
        t.contiguous().view(-1).view(torch.uint8).amax()


def barrier(device: torch.device, flag: torch.Tensor, inputs: Sequence[torch.Tensor | None] = (),
            warm: str = "") -> None:
    """Before each timed call. Without a process group (a one-GPU script) only the sleep. `warm`
    (BenchConfig.warm_mode(): "read", "write" or the controls in WARM_CONTROLS; "" cold): the
    call's `inputs` each touched once first (`touch`), so the call finds them in L2 and the TLBs as
    a model's step would. The touches go before the sleep, not after it: the op then follows the
    sleep (and all-reduce) as a cold one does, with no kernel between them. (The small whole contiguous ops are
    still 0.5-1.7 us slower warm, read or written, in every launch form, runs 52 and 54: not this
    kernel, nor the SMs' carveout; nor the inputs' warmth: "scratch" costs it too, run 55; nor the
    memory the touches sweep: "launch" costs it too, run 56. "fill" costs the dispatch too, not the
    combine, and one profiled round shows neither op's kernels later or longer: docs/PERF_NOTES.md,
    "Run 57"; "launch-out" asks whether the reduction's kernel or its output's allocation costs the
    combine.)"""
    for t in inputs if warm else ():
        if t is not None and 0 < t.numel() * t.element_size() <= WARM_MAX_BYTES:
            touch(t, warm)
    grouped = dist.is_initialized()
    if device.type == "cuda":
        # ~500 us of device sleep, then a one-element all-reduce: every rank starts together,
        # and the host has time to enqueue the op, so the events time the GPU, not Python.
        # (~200 us was measured too short on a slower host: ~220 us of host time per
        # dispatch made the GPU wait and the events timed the host.)
        torch.cuda._sleep(1_000_000)
        if grouped:
            dist.all_reduce(flag)
    elif grouped:
        dist.barrier()


def time_after_barrier(device: torch.device, op: Callable[[], Any], iters: int, warmup: int) -> dict[str, float]:
    """p10 / median / p90 us of `op` on this rank, each call timed like the ops (barrier first,
    then CUDA events around it). Collective: call on every rank."""
    clock, flag = Clock(device), torch.ones(1, device=device)
    samples = []
    for i in range(warmup + iters):
        barrier(device, flag)
        m0 = clock.mark()
        op()
        m1 = clock.mark()
        if i >= warmup:
            clock.sync()
            samples.append(clock.elapsed_us(m0, m1))
    return stats(samples)


def stats(samples: list[float]) -> dict[str, float]:
    t = torch.tensor(samples, dtype=torch.float64)
    q = torch.quantile(t, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    return {"p10": q[0], "median": q[1], "p90": q[2]}


def max_over_ranks(per_rank: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each quantity's statistics taken as the slowest rank's (quantities every rank has)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, per_rank)
    common = [k for k in per_rank if all(k in r for r in gathered)]
    return {k: {s: max(r[k][s] for r in gathered) for s in ("p10", "median", "p90")} for k in common}


def make_routing(spec: CommSpec, n: int, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Inputs of this rank's group: uniform random routing with distinct experts per token."""
    group = dist.get_rank() // spec.tp_size
    gen = torch.Generator().manual_seed(seed * 1000 + group)
    ids = torch.rand(n, spec.num_experts, generator=gen).argsort(dim=1)[:, : spec.topk].to(torch.int32)
    x = torch.randn(n, spec.hidden, generator=gen)
    scale = torch.rand(n, spec.num_scales, generator=gen) + 0.5 if spec.in_dtype == FP8 else None
    weights = torch.rand(n, spec.topk, generator=gen)
    x = x.to(spec.in_dtype)
    return tuple(None if t is None else t.to(device) for t in (x, ids, weights, scale))


def bytes_across(spec: CommSpec, ids: torch.Tensor) -> dict[str, int]:
    """Bytes this rank's tokens must move between ranks: one copy per (token, remote rank)."""
    rank = dist.get_rank()
    dest = ids.long() // spec.num_local_experts
    remote = torch.zeros(ids.shape[0], spec.world_size, dtype=torch.bool, device=ids.device)
    remote.scatter_(1, dest, True)
    remote[:, rank] = False
    pairs = int(remote[torch.arange(ids.shape[0], device=ids.device) % spec.tp_size == rank % spec.tp_size].sum())
    token_bytes = spec.hidden * spec.in_dtype.itemsize + spec.num_scales * 4
    return {
        "dispatch": pairs * token_bytes,
        "combine": pairs * spec.hidden * spec.transfer_dtype.itemsize * spec.tp_size,
    }


def time_comm(comm: Communicator, n: int, preset: BenchPreset, clock: Clock) -> dict[str, Any]:
    spec, device = comm.spec, comm.device
    x, ids, weights, scale = make_routing(spec, n, preset.bench.seed, device)
    flag = torch.ones(1, device=device)
    padded = padded_fits(spec)
    samples: dict[str, list[float]] = {p: [] for p in PHASES if padded or not p.endswith("_padded")}
    y_padded = None
    host: dict[str, list[float]] = {p: [] for p in PHASES[:6]}  # CPU time of each call
    y = None
    weighted, warm = preset.bench.weighted, preset.bench.warm_mode()
    topk_w = weights if weighted else None
    dispatched = (x, ids, topk_w, scale)  # what the dispatches read
    for i in range(preset.bench.warmup + preset.bench.iters):
        barrier(device, flag, dispatched, warm)
        # Host times (h*) are taken inside the event marks (m*): a mark's event record is no
        # part of the call (several us of host time on the GPU machine).
        m0 = clock.mark()
        h0 = time.perf_counter()
        receiver = comm.dispatch_send(x, ids, topk_w, scale)
        h1 = time.perf_counter()
        m1 = clock.mark()
        h1r = time.perf_counter()
        result = receiver.recv()
        h2 = time.perf_counter()
        m2 = clock.mark()
        if y is None:  # stand-in expert output, made once: the benchmark times communication only
            y = torch.randn(result.tokens.shape[0], spec.hidden, device=device).to(spec.out_dtype)
        combine_w = result.weights if weighted else None
        barrier(device, flag, (y, combine_w), warm)
        m3 = clock.mark()
        h3 = time.perf_counter()
        pending = comm.combine_send(y, result.handle, combine_w)
        h4 = time.perf_counter()
        m4 = clock.mark()
        h4r = time.perf_counter()
        pending.recv()
        h5 = time.perf_counter()
        m5 = clock.mark()
        # The whole ops, each between GPU barriers like the split ones.
        barrier(device, flag, dispatched, warm)
        w0, g0 = clock.mark(), time.perf_counter()  # host times of the whole ops leave the marks out
        whole = comm.dispatch(x, ids, topk_w, scale)
        g1, w1 = time.perf_counter(), clock.mark()
        combine_w = whole.weights if weighted else None
        barrier(device, flag, (y, combine_w), warm)
        w2, g2 = clock.mark(), time.perf_counter()
        comm.combine(y, whole.handle, combine_w)
        g3, w3 = time.perf_counter(), clock.mark()
        spans = [(m0, m1), (m1, m2), (m3, m4), (m4, m5), (w0, w1), (w2, w3), (m0, m2), (m3, m5)]
        if padded:
            barrier(device, flag, dispatched, warm)
            p0 = clock.mark()
            res = comm.dispatch_padded(x, ids, topk_w, scale)
            p1 = clock.mark()
            if y_padded is None:
                y_padded = torch.randn(res.tokens.shape, device=device).to(spec.out_dtype)
            combine_w = res.weights if weighted else None
            touch_padded_filled_rows(y_padded, res.counts, warm)
            barrier(device, flag, (combine_w,), warm)
            p2 = clock.mark()
            comm.combine_padded(y_padded, res.handle, combine_w)
            p3 = clock.mark()
            spans += [(p0, p1), (p2, p3)]
        if i >= preset.bench.warmup:
            clock.sync()
            for phase, (a, b) in zip(PHASES, spans):
                samples[phase].append(clock.elapsed_us(a, b))
            for phase, (a, b) in zip(PHASES, [(h0, h1), (h1r, h2), (h3, h4), (h4r, h5), (g0, g1), (g2, g3)]):
                host[phase].append((b - a) * 1e6)
    result_stats = max_over_ranks({p: stats(s) for p, s in samples.items()})
    host_stats = max_over_ranks({p: stats(s) for p, s in host.items()})
    moved = bytes_across(spec, ids)
    total = {k: 0 for k in moved}
    for rank_bytes in gather_objects(moved):
        for k, v in rank_bytes.items():
            total[k] = max(total[k], v)
    return {"phases": result_stats, "host_us": host_stats, "bytes_across_max_rank": total}


# The overlap row's matmul on a GPU: square bf16 of this size (one wave of 128 tiles on an H200).
OVERLAP_MATMUL_DIM = 2048


def time_overlap(comm: Communicator, n: int, preset: BenchPreset, clock: Clock) -> dict[str, Any]:
    """Dispatch send, an independent matmul of about the dispatch's length, dispatch receive.

    Reports the medians (slowest rank) and `ratio` = overlapped / max(dispatch alone, matmul
    alone): 1.0 is perfect overlap, 2.0 none. The matmul's length comes from the dispatch
    alone as timed here, on this communicator, not from another row: a dispatch that ran
    slow elsewhere (run 17's 16-token sweep row) picked 3 matmuls for a 21 us dispatch. The
    combine that must follow each dispatch runs outside the timed window.
    """
    spec, device = comm.spec, comm.device
    x, ids, _, scale = make_routing(spec, n, preset.bench.seed, device)
    flag = torch.ones(1, device=device)
    dim = OVERLAP_MATMUL_DIM if device.type == "cuda" else 256
    a = torch.randn(dim, dim, device=device).to(torch.bfloat16 if device.type == "cuda" else torch.float32)
    y: torch.Tensor | None = None

    def matmuls(reps: int) -> None:
        for _ in range(reps):
            torch.mm(a, a)

    def dispatch_around(reps: int) -> tuple[Any, Any]:
        nonlocal y
        m0 = clock.mark()
        receiver = comm.dispatch_send(x, ids, None, scale)
        matmuls(reps)
        result = receiver.recv()
        m1 = clock.mark()
        if y is None:
            y = torch.zeros(result.tokens.shape[0], spec.hidden, dtype=spec.out_dtype, device=device)
        comm.combine(y, result.handle)  # keeps the dispatch/combine alternation
        return m0, m1

    def matmul_only(reps: int) -> tuple[Any, Any]:
        m0 = clock.mark()
        matmuls(reps)
        return m0, clock.mark()

    def median_us(body: Callable[[int], tuple[Any, Any]], reps: int, iters: int) -> dict[str, float]:
        samples = []
        for i in range(iters + 3):
            barrier(device, flag, (x, ids, scale), preset.bench.warm_mode())
            m0, m1 = body(reps)
            if i >= 3:
                clock.sync()
                samples.append(clock.elapsed_us(m0, m1))
        return stats(samples)

    iters = min(preset.bench.iters, 50)
    # Every rank takes the same matmul chain: the slowest rank's dispatch over its slowest matmul.
    solo = max_over_ranks({"dispatch": median_us(dispatch_around, 0, iters), "one": median_us(matmul_only, 1, 10)})
    reps = max(1, round(solo["dispatch"]["median"] / max(solo["one"]["median"], 1e-3)))
    med = max_over_ranks({
        "matmul": median_us(matmul_only, reps, iters),
        "overlapped": median_us(dispatch_around, reps, iters),
    }) | {"dispatch": solo["dispatch"]}
    alone = max(med["dispatch"]["median"], med["matmul"]["median"])
    return {
        "matmul_reps": reps,
        "dispatch_us": med["dispatch"]["median"],
        "matmul_us": med["matmul"]["median"],
        "overlapped_us": med["overlapped"]["median"],
        "ratio": med["overlapped"]["median"] / alone,
    }


def overlap_row(comm: Communicator, name: str, options: dict[str, Any], n: int, preset: BenchPreset,
                clock: Clock) -> dict[str, Any]:
    """`time_overlap`, on the nvshmem backend with the send kernel on its own stream (the
    option made for work between the halves; a communicator of its own, closed after)."""
    if name != "nvshmem":
        return time_overlap(comm, n, preset, clock)
    split = Communicator(comm.spec, backend=name, device=comm.device, check_inputs=False, send_stream=True, **options)
    try:
        return {**time_overlap(split, n, preset, clock), "send_stream": True}
    finally:
        split.close()


def gather_objects(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def time_dense_all_to_all(spec: CommSpec, n: int, iters: int, device: torch.device, clock: Clock,
                          warm: str = "") -> dict[str, float]:
    """The standard baseline: one dense all_to_all_single of [n*topk, hidden] bf16 per rank
    (`warm`: its input touched once before each barrier, as `barrier` does for the ops)."""
    rows = n * spec.topk
    rows -= rows % spec.world_size
    data = torch.randn(max(rows, spec.world_size), spec.hidden, device=device).to(torch.bfloat16)
    out = torch.empty_like(data)
    flag = torch.ones(1, device=device)
    samples = []
    for i in range(iters + 5):
        barrier(device, flag, (data,), warm)
        a = clock.mark()
        dist.all_to_all_single(out, data)
        b = clock.mark()
        if i >= 5:
            clock.sync()
            samples.append(clock.elapsed_us(a, b))
    return max_over_ranks({"all_to_all": stats(samples)})["all_to_all"]


def median_seconds(op: Callable[[], Any], iters: int) -> float:
    """Median time of `op` on the current device (CUDA events), after 3 untimed calls."""
    for _ in range(3):
        op()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        op()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def copy_rate_gbps(nbytes: int = 1 << 30, iters: int = 20) -> float | None:
    """Raw one-way GPU0 -> GPU1 copy rate (GB/s), measured on rank 0; None without 2 GPUs."""
    if dist.get_rank() != 0 or torch.cuda.device_count() < 2:
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    with torch.cuda.device(0):
        return nbytes / median_seconds(lambda: dst.copy_(src), iters) / 1e9


def local_memory_rates_gbps(nbytes: int = 1 << 30, iters: int = 20) -> dict[str, float] | None:
    """The receive side's other ceiling: this GPU's own memory traffic rate (GB/s, bytes read
    plus bytes written) for a copy within the GPU, a write-only fill, and the dispatch
    receive's pattern (each 16 KiB row read once, written to 4 rows); rank 0 only."""
    if dist.get_rank() != 0 or not torch.cuda.is_available():
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    row, copies = 1 << 14, 4
    rows = src[: nbytes // copies].view(-1, row)
    order = torch.arange(rows.shape[0], device="cuda").repeat_interleave(copies)  # repeats read from L2
    out = dst.view(-1, row)
    return {"copy": 2 * nbytes / median_seconds(lambda: dst.copy_(src), iters) / 1e9,
            "write": nbytes / median_seconds(lambda: dst.fill_(7), iters) / 1e9,
            "replicate_x4": (nbytes + nbytes // copies)
            / median_seconds(lambda: torch.index_select(rows, 0, order, out=out), iters) / 1e9}


def backends_to_run(requested: str, device: torch.device,
                    sms: list[int] | tuple[int, ...] = ()) -> list[tuple[str, str, dict[str, Any]]]:
    """(row label, backend name, backend options) for each backend the run times; `sms`: extra
    nvshmem-nvlink rows with the kernels sized for that many SMs."""
    nvshmem_ok = device.type == "cuda" and nvshmem_available(device)[0]
    if requested == "all":
        rows = [("reference", "reference", {})]
        if nvshmem_ok:  # both transports: the portable put path and direct NVLink stores
            rows += [(f"nvshmem-{t}", "nvshmem", {"transport": t}) for t in ("put", "nvlink")]
    else:
        if requested == "auto":
            requested = "nvshmem" if nvshmem_ok else "reference"
        rows = [(requested, requested, {})]
    if nvshmem_ok and requested in ("all", "nvshmem"):
        rows += [(f"nvshmem-nvlink-{n}sm", "nvshmem", {"transport": "nvlink", "num_sms": n}) for n in sms]
    return rows


def bench_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def measure_copy_rate() -> float | None:
    """The GPU-to-GPU ceiling, measured once per run before any backend is set up."""
    return gather_objects(copy_rate_gbps())[0] if bench_device().type == "cuda" else None


def measure_local_memory_rates() -> dict[str, float] | None:
    """The within-GPU memory ceilings (rank 0's GPU), measured once per run."""
    return gather_objects(local_memory_rates_gbps())[0] if bench_device().type == "cuda" else None


def run(preset: BenchPreset, backend: str, progress: Callable[[str], None], copy_rate: float | None,
        sms: list[int] | tuple[int, ...] = ()) -> dict[str, Any]:
    """Benchmark one preset on every requested backend; call on every rank."""
    device = bench_device()
    clock = Clock(device)
    spec = preset.comm.to_spec(dist.get_world_size())
    rows: list[dict[str, Any]] = []
    for label, name, options in backends_to_run(backend, device, sms):
        comm = None
        for n in preset.bench.num_tokens:
            if comm is None or preset.bench.size_each:
                if comm is not None:
                    comm.close()
                size = dataclasses.replace(spec, max_num_tokens=n) if preset.bench.size_each else spec
                # Value checks of topk_ids read the device (a host sync): off while timing.
                comm = Communicator(size, backend=name, device=device, check_inputs=False, **options)
            progress(f"{preset.name}: {label}, {n} tokens/rank, {preset.bench.iters} iters")
            row = {"backend": label, "num_tokens": n, **time_comm(comm, n, preset, clock)}
            if preset.bench.overlap:
                row["overlap"] = overlap_row(comm, name, options, n, preset, clock)
            rows.append(row)
        if comm is not None:
            comm.close()
    for n in preset.bench.num_tokens:
        progress(f"{preset.name}: dense all_to_all baseline, {n} tokens/rank")
        rows.append({"backend": f"dense_all_to_all_{dist.get_backend()}", "num_tokens": n,
                     "phases": {"dispatch": time_dense_all_to_all(spec, n, preset.bench.iters, device, clock,
                                                                   preset.bench.warm_mode())}})
    return {
        "preset": preset.name,
        "spec": spec.describe(),
        "config": dataclasses.asdict(preset),
        "copy_rate_gbps": copy_rate,
        "rows": rows,
    }


def add_ratios(report: dict[str, Any]) -> None:
    """Speed-ups over the reference backend and fractions of the copy rate, per row."""
    by_key = {(r["backend"], r["num_tokens"]): r for r in report["rows"]}
    for row in report["rows"]:
        ref = by_key.get(("reference", row["num_tokens"]))
        phases = row["phases"]
        if ref and row is not ref and "combine" in phases:
            both = phases["dispatch"]["median"] + phases["combine"]["median"]
            ref_both = ref["phases"]["dispatch"]["median"] + ref["phases"]["combine"]["median"]
            row["speedup_vs_reference"] = ref_both / both
        rate = report.get("copy_rate_gbps")
        if rate and "bytes_across_max_rank" in row:
            row["fraction_of_copy_rate"] = {
                op: row["bytes_across_max_rank"][op] / (phases[op]["median"] * 1e-6) / 1e9 / rate
                for op in ("dispatch", "combine")
                if phases[op]["median"] > 0
            }


def machine_info() -> dict[str, Any]:
    commit = os.environ.get("MOE_BACKEND_COMMIT", "")  # set where the tree has no .git
    try:
        commit = commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = [torch.cuda.get_device_name(i) for i in range(count)]
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "gpus": gpus,
        "torch": torch.__version__,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "dist_backend": dist.get_backend() if dist.is_initialized() else None,
    }


def _warm_note(bench: dict[str, Any]) -> str:
    if not bench.get("warm_inputs"):
        return ""
    how = {"read": "; inputs warm", "write": "; inputs warm (rewritten)",
           "scratch": "; control: a scratch buffer of each input's size read before each call, inputs cold",
           "launch": f"; control: {LAUNCH_CONTROL_BYTES} bytes read for each input before each call, inputs cold",
           "launch-out": f"; control: {LAUNCH_CONTROL_BYTES} bytes read into a given output for each input before "
                         "each call, inputs cold",
           "fill": f"; control: {LAUNCH_CONTROL_BYTES} bytes filled for each input before each call, inputs cold"}
    return how[bench.get("warm_by", "read")]


def format_table(report: dict[str, Any]) -> str:
    lines = [f"== {report['preset']}: {report['spec']}"
             + (f"; GPU-to-GPU copy {report['copy_rate_gbps']:.0f} GB/s" if report.get("copy_rate_gbps") else "")
             + _warm_note(report.get("config", {}).get("bench", {}))]
    head = f"{'backend':<26}{'tokens':>7}" + "".join(f"{p:>16}" for p in PHASES) + f"{'vs ref':>8}{'%copy d/c':>12}"
    lines += [head, "-" * len(head)]
    for row in report["rows"]:
        ph = row["phases"]
        cells = "".join(f"{ph[p]['median']:>16.1f}" if p in ph else f"{'-':>16}" for p in PHASES)
        speed = f"{row['speedup_vs_reference']:>7.2f}x" if "speedup_vs_reference" in row else f"{'':>8}"
        frac = row.get("fraction_of_copy_rate")
        fr = f"{100 * frac['dispatch']:>5.0f}/{100 * frac['combine']:<5.0f}" if frac and len(frac) == 2 else f"{'':>11}"
        lines.append(f"{row['backend']:<26}{row['num_tokens']:>7}{cells}{speed} {fr}")
    for row in report["rows"]:
        if "overlap" in row:
            o = row["overlap"]
            lines.append(f"overlap {row['backend']:<18}{row['num_tokens']:>7}: dispatch {o['dispatch_us']:.1f} us, "
                         f"matmul x{o['matmul_reps']} {o['matmul_us']:.1f} us, send+matmul+recv "
                         f"{o['overlapped_us']:.1f} us = {o['ratio']:.2f}x the longer alone"
                         + (" (send stream)" if o.get("send_stream") else ""))
    mem = report.get("local_memory_gbps")
    if mem:
        lines.append(f"within-GPU memory traffic (read + write): copy {mem['copy']:.0f} GB/s, "
                     f"write-only {mem['write']:.0f} GB/s, each row to 4 rows {mem['replicate_x4']:.0f} GB/s")
    for entry in (report.get("sm_ceilings_gbps") or {}).values():
        lines.append(f"probe kernel on {entry['sms']} SMs (GB/s): "
                     + ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in entry.items() if k != "sms"))
    floor = report.get("latency_floor_us")
    if floor:
        lines.append("latency floor (NVLink store + wait, every peer): "
                     + ", ".join(f"{k.replace('_', ' ')} {v['median']:.1f} us" for k, v in floor.items()))
    lines.append("(median us per phase, slowest rank; 'dispatch'/'combine' = the whole op, comm.dispatch / "
                 "comm.combine; '*_split' = send + recv timed as split phases)")
    return "\n".join(lines)


def write_json(path: str | Path, reports: list[dict[str, Any]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine_info(), "results": reports}, indent=2) + "\n")
