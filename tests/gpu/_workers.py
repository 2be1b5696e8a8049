"""Per-rank bodies of the GPU tests (importable by spawned processes)."""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from moe_backend.backends import nvshmem_runtime as rt
from moe_backend.communicator import Communicator
from moe_backend.spec import FP8, CommSpec
from moe_backend.testing import (
    NUM_TOKENS_MODES,
    ROUTINGS,
    Case,
    bitwise_equal,
    expert_fn,
    make_inputs,
    oracle_combine,
    oracle_dispatch,
    run_case,
    run_padded_case,
)

DTYPES_IN = (torch.bfloat16, torch.float16, torch.float32, FP8)
DTYPES_OUT = (torch.bfloat16, torch.float16, torch.float32)


def gpu_world() -> int:
    """Ranks of the multi-GPU tests: MOE_TEST_WORLD (default 2; 4 or 8 on larger machines)."""
    world = int(os.environ.get("MOE_TEST_WORLD", "2"))
    if world < 2:
        raise ValueError(f"MOE_TEST_WORLD must be >= 2 (tests/gpu/test_nvshmem_single.py covers 1), got {world}")
    return world


def shared_gpu() -> bool:
    """MOE_TEST_SHARED_GPU=1: every rank on the one visible GPU (NVSHMEM's multiple PEs per
    GPU; its P2P transport maps a PE of the same device), over gloo, since NCCL refuses two
    ranks on one device. The GPU time-slices the ranks' kernels, so each cross-rank wait may
    last a time slice: a check of the multi-rank kernel paths' results where only one GPU is
    lent, never of their speed."""
    return os.environ.get("MOE_TEST_SHARED_GPU", "0") == "1"


def dist_backend() -> str:
    """The process group of the multi-GPU tests: NCCL, or gloo on a shared GPU."""
    return "gloo" if shared_gpu() else "nccl"


def random_cases(seed: int, count: int, world: int = 2, sources: int | None = None) -> list[Case]:
    """`count` random cases, then fixed DeepSeek-like and prefill-sized ones, for `world` ranks.
    `sources`: the most source tokens (groups x max_num_tokens) an arena may hold (the nvshmem
    backend's MAX_SOURCES_PER_SM per SM of `num_sms`); the prefill-sized cases take fewer tokens to fit."""
    rng = random.Random(seed)
    cases = []
    tps = [t for t in (1, 1, 2, 4) if world % t == 0]  # attention-TP replicas sharing a group
    for i in range(count):
        tp = rng.choice(tps)
        L = rng.choice([1, 2, 3, 4, 8, 16])
        E = L * world
        topk = rng.randint(1, min(E, 8))
        hidden = rng.choice([8, 36, 64, 128, 200, 256, 1000])
        in_dtype = DTYPES_IN[i % 4]
        block = None
        if in_dtype == FP8:
            block = rng.choice([d for d in (4, 8, 12, 16, 32, 64, 128) if hidden % d == 0] or [hidden])
        spec = CommSpec(
            num_experts=E, topk=topk, hidden=hidden, max_num_tokens=rng.randint(1, 48), world_size=world,
            tp_size=tp, in_dtype=in_dtype, out_dtype=rng.choice(DTYPES_OUT), scale_block_size=block,
            combine_in_float32=rng.random() < 0.4,
        )
        cases.append(Case(spec, routing=ROUTINGS[i % len(ROUTINGS)], seed=seed * 1000 + i,
                          weighted=rng.random() < 0.6, num_tokens_mode=NUM_TOKENS_MODES[(i // 4) % 3]))
    # DeepSeek-like shape once: 256 experts, top-8, hidden 7168, fp8 + 128-blocks and bf16.
    cases.append(Case(CommSpec(256, 8, 7168, 64, world, in_dtype=FP8, scale_block_size=128), "uniform",
                      seed * 1000 + 998, True, "tensor"))
    cases.append(Case(CommSpec(256, 8, 7168, 64, world), "skewed", seed * 1000 + 999, False, "int"))
    # Prefill-sized rounds: several tokens per send block, copy warp and combine warp.
    def tokens(m: int, groups: int) -> int:
        return m if sources is None else min(m, sources // groups)

    cases.append(Case(CommSpec(8, 2, 512, tokens(1500, world), world), "uniform", seed * 1000 + 996, True,
                      "tensor"))
    if world % 2 == 0:  # two replicas per group
        cases.append(Case(CommSpec(16, 4, 1024, tokens(1100, world // 2), world, tp_size=2, in_dtype=FP8,
                                   scale_block_size=128, out_dtype=torch.float16, combine_in_float32=True),
                          "skewed", seed * 1000 + 997, True, "int"))
        # Replicas with rows of two 128-vector copy passes: the padded dispatch's row slices where
        # a replica sends every other token (round 69).
        cases.append(Case(CommSpec(4 * world, 4, 2048, 48, world, tp_size=2), "uniform", seed * 1000 + 994, True,
                          "tensor"))
    if world % 4 == 0:  # four replicas per group, at least once
        cases.append(Case(CommSpec(8 * world, 4, 256, 40, world, tp_size=4), "uniform", seed * 1000 + 995, True, "int"))
    return cases


def contract_worker(seed: int, count: int, transports: tuple[str, ...], **options: Any) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    sources = rt.MAX_SOURCES_PER_SM * options["num_sms"] if options.get("num_sms") else None  # the arena's limit
    cases = random_cases(seed, count, world, sources)
    for case in cases:  # cases outside: the oracle's answer is kept for the latest
        for transport in transports:
            comm = Communicator(case.spec, backend="nvshmem", transport=transport, sync_check=True, **options)
            try:
                run_case(comm, case)
                if rank == 0 and case.spec.max_num_tokens >= 64:
                    print(f"[{transport}] ok {case.describe()}", flush=True)
            except Exception as err:
                raise AssertionError(f"[{transport}] {case.describe()}: {err}") from err
            finally:
                comm.close()
        # The reference backend, same case (on the GPU over NCCL, on the CPU over gloo when the
        # ranks share a GPU): both equal the oracle, hence each other.
        run_case(Communicator(case.spec, backend="reference"), case)
    if rank == 0:
        print(f"contract: {(len(transports) + 1) * len(cases)} cases ok on {world} ranks, seed={seed}", flush=True)


def rounds_worker(seed: int, transport: str, rounds: int, tokens: int = 40, **options: Any) -> None:
    spec = CommSpec(16, 4, 512, tokens, dist.get_world_size(), combine_in_float32=False)
    a = Communicator(spec, backend="nvshmem", transport=transport, sync_check=False, **options)
    b = Communicator(spec, backend="nvshmem", transport=transport, sync_check=False, **options)
    assert a.backend.arena is b.backend.arena, "communicators with one spec must share the arena"
    for i in range(rounds):
        comm = a if i % 3 else b
        run_case(comm, Case(spec, ROUTINGS[i % 4], seed * 7919 + i, i % 2 == 0, NUM_TOKENS_MODES[i % 3]))
    # Split phases with other GPU work in between, and the interleaving guard.
    case = Case(spec, "uniform", seed, True, "tensor")
    g = make_inputs(case)[dist.get_rank()]
    dev = a.device
    recv = a.dispatch_send(g.x.to(dev), g.topk_ids.to(dev), g.topk_weights.to(dev), None, g.num_tokens)
    try:
        b.dispatch_send(g.x.to(dev), g.topk_ids.to(dev), g.topk_weights.to(dev), None, g.num_tokens)
        raise AssertionError("interleaved rounds on a shared arena were not rejected")
    except RuntimeError as err:
        assert "interleave" in str(err), err
    _ = torch.randn(256, 256, device=dev) @ torch.randn(256, 256, device=dev)
    res = recv.recv()
    y = torch.zeros(res.tokens.shape[0], spec.hidden, dtype=spec.out_dtype, device=dev)
    a.combine_send(y, res.handle, res.weights).recv()
    a.backend.check_error()
    torch.cuda.synchronize()
    a.close()
    b.close()


class _StaticStep:
    """A decode step on fixed input buffers (the live batch size in a device tensor), as a CUDA
    graph or a compiled function runs it: `load` a case into the buffers, `run` dispatch, the
    experts and combine, `check` both results against the oracle bit for bit."""

    def __init__(self, transport: str, tokens: int, **options: Any) -> None:
        self.rank = dist.get_rank()
        self.spec = spec = CommSpec(8, 3, 256, tokens, dist.get_world_size(), in_dtype=torch.bfloat16,
                                    out_dtype=torch.bfloat16)
        self.comm = Communicator(spec, backend="nvshmem", transport=transport, **options)
        dev, M = self.comm.device, spec.max_num_tokens
        self.x = torch.zeros(M, spec.hidden, dtype=spec.in_dtype, device=dev)
        self.ids = torch.full((M, spec.topk), -1, dtype=torch.int32, device=dev)
        self.w = torch.zeros(M, spec.topk, dtype=torch.float32, device=dev)
        self.n = torch.zeros(1, dtype=torch.int32, device=dev)

    def load(self, case: Case) -> list[Any]:
        groups = make_inputs(case)
        mine = groups[self.rank // self.spec.tp_size]
        rows = mine.x.shape[0]
        self.x.zero_()
        self.x[:rows].copy_(mine.x)
        self.ids.fill_(-1)
        self.ids[:rows].copy_(mine.topk_ids)
        self.w.zero_()
        self.w[:rows].copy_(mine.topk_weights)
        self.n.fill_(mine.num_tokens)
        return groups

    def run(self) -> tuple[Any, torch.Tensor]:
        comm, L = self.comm, self.spec.num_local_experts
        res = comm.dispatch(self.x, self.ids, self.w, None, self.n)
        local = res.local_experts()
        y = expert_fn(res.tokens, local + self.rank * L, self.spec.out_dtype)
        return res, comm.combine(y, res.handle, weights=res.weights)

    def check(self, res: Any, out: torch.Tensor, groups: list[Any], case: Case) -> None:
        spec, rank = self.spec, self.rank
        want = oracle_dispatch(spec, groups, rank)
        total = int(want.tokens_per_expert.sum())
        assert bitwise_equal(res.tokens_per_expert.cpu(), want.tokens_per_expert), case.describe()
        assert bitwise_equal(res.tokens[:total].cpu(), want.tokens), case.describe()
        assert bitwise_equal(res.weights[:total].cpu(), want.weights), case.describe()
        for name in ("src_group", "src_token", "src_k"):
            assert bitwise_equal(getattr(res.handle, name)[:total].cpu(), getattr(want, name)), name
        want_out = oracle_combine(spec, groups, rank // spec.tp_size, True)
        rows = want_out.shape[0]
        assert bitwise_equal(out[:rows].cpu(), want_out), f"combine differs [{case.describe()}]"
        assert not out[rows:].any(), "rows past the input must be zero"

    def replay_cases(self, seed: int, count: int, step: Callable[[], tuple[Any, torch.Tensor]]) -> None:
        """`count` fresh cases, each loaded, run by `step` and checked."""
        for i in range(count):
            case = Case(self.spec, ROUTINGS[i % 4], seed + 100 + i, True, "tensor")
            groups = self.load(case)
            res, out = step()
            torch.cuda.synchronize()
            self.comm.backend.check_error()
            self.check(res, out, groups, case)


def graph_worker(seed: int, transport: str, replays: int, tokens: int = 32, **options: Any) -> None:
    step = _StaticStep(transport, tokens, **options)
    case0 = Case(step.spec, "uniform", seed, True, "tensor")
    groups = step.load(case0)
    res, out = step.run()
    torch.cuda.synchronize()
    step.check(res, out, groups, case0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res, out = step.run()

    def replay() -> tuple[Any, torch.Tensor]:
        graph.replay()
        return res, out

    step.replay_cases(seed, replays, replay)
    graph.reset()  # its memory before the arena's
    torch.cuda.synchronize()
    step.comm.close()


def compile_worker(seed: int, transport: str, calls: int, tokens: int = 32) -> None:
    """The same step under `torch.compile` (its graph breaks at dispatch and combine, which run
    eagerly; the expert stand-in and the row search are compiled): each call bit-exact."""
    step = _StaticStep(transport, tokens, check_inputs=False)
    compiled = torch.compile(step.run)
    step.replay_cases(seed, calls, compiled)
    torch.cuda.synchronize()
    step.comm.close()


def timeout_worker(transport: str) -> None:
    rank = dist.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device())
    # Dispatch: rank 1 never sends; rank 0's receive must raise naming the phase and rank 1.
    spec = CommSpec(8, 2, 64, 16, 2)
    comm = Communicator(spec, backend="nvshmem", transport=transport, timeout_s=0.5, sync_check=True)
    g = make_inputs(Case(spec, "uniform", 1))[rank]
    if rank == 0:
        try:
            comm.dispatch(g.x.to(dev), g.topk_ids.to(dev), None, None, g.num_tokens)
            raise AssertionError("dispatch did not time out")
        except RuntimeError as err:
            msg = str(err)
            assert "dispatch_recv" in msg and "rank 1" in msg, msg
            print(f"rank 0 got: {msg}", flush=True)
    dist.barrier()
    # Combine: both dispatch, rank 1 skips combine; rank 0's combine receive must raise.
    spec2 = CommSpec(8, 2, 32, 16, 2)
    comm2 = Communicator(spec2, backend="nvshmem", transport=transport, timeout_s=0.5, sync_check=True)
    g = make_inputs(Case(spec2, "uniform", 2))[rank]
    res = comm2.dispatch(g.x.to(dev), g.topk_ids.to(dev), None, None, g.num_tokens)
    if rank == 0:
        y = torch.zeros(res.tokens.shape[0], spec2.hidden, dtype=spec2.out_dtype, device=dev)
        try:
            comm2.combine(y, res.handle)
            raise AssertionError("combine did not time out")
        except RuntimeError as err:
            msg = str(err)
            assert "combine_recv" in msg and "rank 1" in msg, msg
            print(f"rank 0 got: {msg}", flush=True)
    torch.cuda.synchronize()
    dist.barrier()


def contract_tasks_worker() -> None:
    """The contract tasks the CPU suite runs on the reference (tests/contract_tasks.py), on the
    nvshmem backend with each transport: every bad input refused before communicating and the
    communicator usable after, send and receive split with work between, `padded()`, and
    combine of just the valid rows once the handle knows their count."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import contract_tasks

    for transport in ("put", "nvlink"):
        options = {"transport": transport}
        try:
            refused = contract_tasks.bad_inputs("nvshmem", options)
            assert refused == contract_tasks.BAD_INPUTS_CPU + 1, f"bad_inputs refused {refused}"
            contract_tasks.construction_checks("nvshmem", options)
            contract_tasks.split_phases("nvshmem", options)
            contract_tasks.padded_view("nvshmem", options)
            contract_tasks.host_valid_rows("nvshmem", options)
        except Exception as err:
            raise AssertionError(f"[{transport}] {type(err).__name__}: {err}") from err
    contract_tasks.host_valid_rows("reference")


LATENCY_KERNELS = ("dispatch_fused_kernel", "combine_send_kernel", "combine_recv_kernel")


def traced_launches(step: Callable[..., object], *args: object) -> list[dict[str, Any]]:
    """Every kernel launch `step(*args)` made, in start order, as the profiler's trace events
    (`name`, `ts`, `args`: grid, stream, ...)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(*args)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def traced_kernels(step: Callable[..., object], *args: object,
                   names: tuple[str, ...] = LATENCY_KERNELS) -> dict[str, dict[str, Any]]:
    """The trace arguments (grid, stream, ...) of each kernel of `names` (by default the latency
    kernels) that `step(*args)` launched (the last launch of each)."""
    kernels: dict[str, dict[str, Any]] = {}
    for event in traced_launches(step, *args):
        for kernel in names:
            if kernel in event.get("name", ""):
                kernels[kernel] = event["args"]
    return kernels


def traced_grids(step: Callable[..., object], *args: object) -> dict[str, int]:
    """The blocks of each latency kernel that `step(*args)` launched, by the profiler's trace."""
    return {k: a["grid"][0] for k, a in traced_kernels(step, *args).items()}


def wide_recv_worker(seed: int, large_calls: int, wide: bool, whole: str | None = "1") -> None:
    """The whole combine's receive grid, by the profiler, and its results, bit for bit: with
    WIDE_RECV a warp per item of the call (more blocks than SMs where the call's rows pass them),
    otherwise the side stream's grid (a block per SM at most). `whole` "1": every call's receive
    launched by PDL on the send's stream; None (the default, round 53): only the calls whose wide
    grid passes the side stream's, the others on the side stream."""
    # Read when an arena is created.
    if whole is None:
        os.environ.pop("MOE_BACKEND_NVSHMEM_WHOLE_COMBINE", None)
    else:
        os.environ["MOE_BACKEND_NVSHMEM_WHOLE_COMBINE"] = whole
    os.environ["MOE_BACKEND_NVSHMEM_WIDE_RECV"] = "1" if wide else "0"
    world, rank = dist.get_world_size(), dist.get_rank()
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    # hidden 2048: at most 4 combine slices a token; a 256-token arena's side-stream grid is min(SMs, 1024).
    spec = CommSpec(num_experts=8 * world, topk=4, hidden=2048, max_num_tokens=256, world_size=world)
    comm = Communicator(spec, backend="nvshmem", transport="nvlink", sync_check=True)
    try:
        # Calls where every group's rows pass the SMs (the wide grid exceeds them), and one where none
        # does; seeds drawn until both are found.
        rows_of: dict[int, list[int]] = {}
        large: list[int] = []
        small: list[int] = []
        for s in range(seed, seed + 400):
            if len(large) == large_calls and small:
                break
            rows_of[s] = rows = [g.x.shape[0] for g in make_inputs(Case(spec, seed=s))]
            if min(rows) > sms + 8 and len(large) < large_calls:
                large.append(s)
            elif max(rows) < sms // 2 and not small:
                small.append(s)
        assert len(large) == large_calls and small, f"no seeds of both sizes in {rows_of}"
        for s in large + small:
            case = Case(spec, "uniform", seed=s, num_tokens_mode="tensor")
            kernels = traced_kernels(run_case, comm, case)
            got = kernels["combine_recv_kernel"]["grid"][0]
            rows = rows_of[s][rank]
            want = max(min(sms, 256 * 4), rows) if wide else min(sms, 256 * 4)  # 4 warps a block, 4 slices a row
            what = (f"{case.describe()}, rank {rank}, {rows} rows, WIDE_RECV={int(wide)}, "
                    f"WHOLE_COMBINE={whole or 'unset'}")
            assert got == want, f"[{what}] receive grid {got}, want {want}"
            same_stream = kernels["combine_recv_kernel"]["stream"] == kernels["combine_send_kernel"]["stream"]
            want_same = whole == "1" or (whole is None and wide and want > min(sms, 256 * 4))
            assert same_stream == want_same, f"[{what}] receive on the send's stream: {same_stream}, want {want_same}"
    finally:
        comm.close()


def _whole_dispatch(comm: Communicator, args: tuple[Any, ...], out: list[Any]) -> None:
    out.append(comm.dispatch(*args))


def _send_work_receive(comm: Communicator, args: tuple[Any, ...], a: torch.Tensor, matmuls: int,
                       out: list[Any]) -> None:
    pending = comm.dispatch_send(*args)
    for _ in range(matmuls):
        torch.mm(a, a)
    out.append(pending.recv())


def work_between_worker(seed: int, tokens: int, matmuls: int, rounds: int = 3) -> None:
    """DeepSeek prefill-sized rows (hidden 7168, top-8 of 256, bf16) with `tokens` a rank, the send
    kernel on its own stream (send_stream=True) and a chain of 2048^2 matmuls between
    dispatch_send and dispatch_recv, as the benchmark's overlap row runs them: each round's rows
    and counts bit for bit those of a whole dispatch of the same inputs (no wait may time out).
    The split send never goes by copy engine unless MOE_BACKEND_NVSHMEM_CE_SEND=1 forces it, and
    then the whole dispatch does too. (By default the whole dispatch of these arenas need not: run
    43 at EP2 sent neither the 1024- nor the 2048-token arena's by copy engine.)"""
    world, rank = dist.get_world_size(), dist.get_rank()
    spec = CommSpec(num_experts=256, topk=8, hidden=7168, max_num_tokens=tokens, world_size=world)
    comm = Communicator(spec, backend="nvshmem", transport="nvlink", sync_check=True, send_stream=True)
    dev = comm.device
    a = torch.randn(2048, 2048, device=dev).to(torch.bfloat16)
    forced = os.environ.get("MOE_BACKEND_NVSHMEM_CE_SEND") == "1"
    # The copy-engine send's kernels: its flag kernels, or the round fill where the copy engines
    # copy the flags too (MOE_BACKEND_NVSHMEM_CE_FLAG_COPY=1).
    ce_kernels = ("ce_flag_kernel", "ce_round_fill_kernel")
    try:
        for s in range(seed, seed + rounds):
            g = make_inputs(Case(spec, "uniform", s, True, "none"))[rank]
            # rows past num_tokens are garbage
            args = (g.x.to(dev), g.topk_ids.to(dev), g.topk_weights.to(dev), None, g.num_tokens)
            what = f"seed {s}, rank {rank}, {tokens} tokens, {matmuls} matmuls between"
            out: list[Any] = []
            by_ce = bool(traced_kernels(_whole_dispatch, comm, args, out, names=ce_kernels))
            assert by_ce or not forced, f"[{what}] a forced whole dispatch did not send by copy engine"
            whole = out.pop()
            want_tokens, want_counts = whole.tokens.clone(), whole.tokens_per_expert.clone()
            y = torch.zeros(whole.tokens.shape[0], spec.hidden, dtype=spec.out_dtype, device=dev)
            comm.combine(y, whole.handle)
            by_ce = bool(traced_kernels(_send_work_receive, comm, args, a, matmuls, out, names=ce_kernels))
            assert forced or not by_ce, f"[{what}] a split send went by copy engine"
            got = out.pop()
            total = int(want_counts.sum())
            assert bitwise_equal(got.tokens_per_expert, want_counts), f"[{what}] tokens_per_expert"
            assert bitwise_equal(got.tokens[:total], want_tokens[:total]), f"[{what}] tokens"
            comm.combine(y, got.handle)
        torch.cuda.synchronize()
    finally:
        comm.close()


def padded_worker(seed: int, count: int, env: dict[str, str] | None = None,
                  transports: tuple[str, ...] = ("nvlink", "put"), replays: int = 3) -> None:
    """The padded layout on the nvshmem backend against the oracle: the padded kernels wherever
    they serve (nvlink, rows of 16-byte multiples), the contiguous path's derivation elsewhere;
    each case twice on one communicator with a contiguous round between (they share the arena),
    then CUDA-graph replays of a padded step on fresh inputs (the round advanced on the device).
    `env`: the backend's variables (read when a padded region is made), e.g. PADDED_PARTIALS=1."""
    os.environ.update(env or {})
    rank, world = dist.get_rank(), dist.get_world_size()
    cases = random_cases(seed, count, world)
    native = 0
    for case in cases:  # cases outside: the oracle's answer is kept for the latest
        for transport in transports:
            comm = Communicator(case.spec, backend="nvshmem", transport=transport, sync_check=True)
            try:
                for again in (False, True):  # the second time with x and x_scale off a 16-byte boundary
                    run_padded_case(comm, case, misaligned=again)
                    run_case(comm, case)
                served = bool(comm.backend.arena._pad)
                if served and comm.backend.arena._pad.bytes != rt.padded_region_bytes(case.spec):
                    raise AssertionError("padded_region_bytes differs from the kernels' pad_region_bytes")
                if served != (rt.padded_unsupported(case.spec, comm.backend.transport) is None):
                    raise AssertionError(f"padded kernels served: {served}, expected the opposite")
                native += served
            except Exception as err:
                raise AssertionError(f"[{transport}] padded {case.describe()}: {err}") from err
            finally:
                comm.close()
    if "nvlink" in transports and native == 0:
        raise AssertionError("no case took the padded kernels")
    for transport in transports:
        _padded_graph(seed, transport, replays)
    if rank == 0:
        print(f"padded: {2 * len(transports) * len(cases)} cases ok on {world} ranks ({native} by the padded "
              f"kernels), graphs on {transports}, seed={seed}", flush=True)


def _padded_graph(seed: int, transport: str, replays: int, tokens: int = 24) -> None:
    """One padded step (dispatch, stand-in experts, combine) captured once and replayed on fresh
    inputs copied into its static tensors; every replay checked against the oracle."""
    world, rank = dist.get_world_size(), dist.get_rank()
    spec = CommSpec(8 * world, 4, 256, tokens, world, in_dtype=FP8, scale_block_size=128)
    comm = Communicator(spec, backend="nvshmem", transport=transport, sync_check=True)
    dev = comm.device
    L = spec.num_local_experts
    x = torch.zeros(tokens, spec.hidden, dtype=spec.in_dtype, device=dev)
    ids = torch.zeros(tokens, spec.topk, dtype=torch.int32, device=dev)
    w = torch.zeros(tokens, spec.topk, device=dev)
    scale = torch.zeros(tokens, spec.num_scales, device=dev)
    n = torch.zeros(1, dtype=torch.int32, device=dev)
    experts = (torch.arange(L, device=dev)[:, None] + rank * L).expand(L, world * tokens).reshape(-1)

    def step() -> torch.Tensor:
        res = comm.dispatch_padded(x, ids, w, scale, n)
        y = expert_fn(res.tokens.reshape(-1, spec.hidden), experts, spec.out_dtype).view(L, -1, spec.hidden)
        return comm.combine_padded(y, res.handle, weights=res.weights)

    def load(i: int) -> list:
        groups = make_inputs(Case(spec, ROUTINGS[i % 3], seed * 100 + i, True, "tensor"))
        mine = groups[rank]
        rows = mine.x.shape[0]
        x.zero_()[:rows] = mine.x.to(dev)
        ids.fill_(-1)[:rows] = mine.topk_ids.to(dev)
        w[:rows] = mine.topk_weights.to(dev)
        scale[:rows] = mine.x_scale.to(dev)
        n.fill_(mine.num_tokens)
        return groups

    def check(out: torch.Tensor, groups: list, what: str) -> None:
        rows = groups[rank].x.shape[0]
        want = oracle_combine(spec, groups, rank, True)
        if not (bitwise_equal(out[:rows].cpu(), want) and not out[rows:].any()):
            raise AssertionError(f"[{transport}] padded graph {what}: combine output differs from the oracle")

    groups = load(0)
    check(step(), groups, "eager")  # also allocates the padded region (collective; not in a capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for i in range(1, replays + 1):
        groups = load(i)
        graph.replay()
        torch.cuda.synchronize()
        check(out, groups, f"replay {i}")
    graph.reset()
    torch.cuda.synchronize()
    comm.close()
