#!/usr/bin/env python3
"""Where the host (CPU) time of an nvshmem dispatch/combine goes, layer by layer.

On `--world-size` GPUs (one NCCL process each; default 2, or 1 where only one is visible),
DeepSeek decode shape (E=256, top-8, H=7168, fp8 + 128-block scales, 128 tokens/rank,
unweighted), `time.perf_counter_ns` around each call, N calls each:
  comm      Communicator.dispatch_send / recv / combine_send / recv (check_inputs=False, as the
            bench), and the whole ops users call: dispatch / combine
  backend   NvshmemBackend.dispatch_send / dispatch_recv / combine_send / combine_recv
  raw_op    torch.ops.moe_backend.<op>.default, called directly with the backend's ctx (and
            dispatch_whole)
  ref       references: an op without tensors (torch.ops.moe_backend.n_pes), a one-tensor aten
            op (aten.alias), torch.empty on the GPU, x.zero_() (one kernel launch), an event record;
            launch_cost: the host ns of one launch of an empty kernel from C++, with 8 bytes of
            arguments and with the backend's Params by value (their difference is what passing
            Params costs every launch)
Rounds stay in protocol order on both ranks (send, recv, combine send, combine recv), and the
stream is synchronised between rounds (outside the timed windows), so the GPU never has a
backlog. Then a torch.profiler trace of 30 Communicator rounds: top CPU ops by self time.

Writes (rank 0) at most 2 files to OUT_DIR: profile_host.json (median/p10/p90 in us per
layer/call, both ranks) and profile_host.txt (tables + the profiler summary). Robust: every
section runs under its own try/except and the files are written whatever fails.

    python3 scripts/profile_host.py OUT_DIR [--iters 300]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if os.path.isdir("/tmp/site") and "/tmp/site" not in sys.path:  # wheels gpu_check.sh installed (nvshmem4py)
    sys.path.append("/tmp/site")


def _stats(ns: list[int]) -> dict[str, float]:
    if not ns:
        return {}
    v = sorted(x / 1e3 for x in ns)
    pick = lambda q: v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))]  # noqa: E731
    return {"p10": pick(0.1), "median": pick(0.5), "p90": pick(0.9), "n": len(v)}


def _worker(out_dir: str, iters: int) -> None:
    import torch
    import torch.distributed as dist

    from moe_backend.communicator import Communicator
    from moe_backend.spec import FP8, CommSpec

    rank = dist.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device())
    res: dict = {"rank": rank, "errors": {}, "times_us": {}}
    text: list[str] = []

    def section(name, fn):
        try:
            fn()
        except Exception:  # keep going: the other sections still report
            res["errors"][name] = traceback.format_exc(limit=6)
            try:
                torch.cuda.synchronize()
            except Exception:
                pass

    spec = CommSpec(256, 8, 7168, 128, dist.get_world_size(), in_dtype=FP8, out_dtype=torch.bfloat16,
                    scale_block_size=128)
    n = 128
    gen = torch.Generator().manual_seed(1234 + rank)
    ids = torch.rand(n, spec.num_experts, generator=gen).argsort(dim=1)[:, : spec.topk].to(torch.int32).to(dev)
    x = torch.randn(n, spec.hidden, generator=gen).to(FP8).to(dev)
    scale = (torch.rand(n, spec.num_scales, generator=gen) + 0.5).to(dev)
    comm = Communicator(spec, backend="nvshmem", device=dev, check_inputs=False)
    be = comm.backend
    res["transport"] = getattr(be, "transport", "?")
    y = torch.randn(spec.max_recv_tokens, spec.hidden, device=dev).to(spec.out_dtype)  # stand-in expert output

    def collect(tag: str, samples: dict[str, list[int]]) -> None:
        for k, v in samples.items():
            res["times_us"][f"{tag}.{k}"] = _stats(v)

    def sync_round():
        torch.cuda.synchronize()
        dist.barrier()

    def comm_rounds(count: int, record: dict | None):
        for _ in range(count):
            sync_round()
            t0 = time.perf_counter_ns()
            r = comm.dispatch_send(x, ids, None, scale)
            t1 = time.perf_counter_ns()
            out = r.recv()
            t2 = time.perf_counter_ns()
            t3 = time.perf_counter_ns()
            c = comm.combine_send(y, out.handle)
            t4 = time.perf_counter_ns()
            c.recv()
            t5 = time.perf_counter_ns()
            sync_round()
            t6 = time.perf_counter_ns()
            whole = comm.dispatch(x, ids, None, scale)
            t7 = time.perf_counter_ns()
            comm.combine(y, whole.handle)
            t8 = time.perf_counter_ns()
            if record is not None:
                for k, a, b in (("dispatch_send", t0, t1), ("dispatch_recv", t1, t2), ("combine_send", t3, t4),
                                ("combine_recv", t4, t5), ("dispatch", t6, t7), ("combine", t7, t8)):
                    record.setdefault(k, []).append(b - a)

    def new_rec():
        return {k: [] for k in ("dispatch_send", "dispatch_recv", "combine_send", "combine_recv")}

    def run_comm():
        comm_rounds(20, None)  # warm-up (lazy module loading, allocator)
        rec = new_rec()
        comm_rounds(iters, rec)
        collect("comm", rec)

    def run_backend():
        from moe_backend.result import Handle

        rec = new_rec()
        for i in range(iters + 10):
            sync_round()
            t0 = time.perf_counter_ns()
            pend = be.dispatch_send(x, ids, None, scale, n)
            t1 = time.perf_counter_ns()
            got = be.dispatch_recv(pend)
            t2 = time.perf_counter_ns()
            h = Handle(comm.id, 0, spec, n, n, got.tokens_per_expert, got.expert_offsets, got.src_group,
                       got.src_token, got.src_k, ids, got.backend_state)
            outb = torch.empty(n, spec.hidden, dtype=spec.out_dtype, device=dev)
            t3 = time.perf_counter_ns()
            cp = be.combine_send(y, h, None, outb)
            t4 = time.perf_counter_ns()
            be.combine_recv(cp, outb)
            t5 = time.perf_counter_ns()
            if i >= 10:
                for k, a, b in (("dispatch_send", t0, t1), ("dispatch_recv", t1, t2), ("combine_send", t3, t4),
                                ("combine_recv", t4, t5)):
                    rec[k].append(b - a)
        collect("backend", rec)

    def run_raw():
        ops = torch.ops.moe_backend
        ds, dr, cs, cr = (ops.dispatch_send.default, ops.dispatch_recv.default, ops.combine_send.default,
                          ops.combine_recv.default)
        dw = ops.dispatch_whole.default
        ctx = be.arena.ctx
        code = be._in_code
        outb = torch.empty(n, spec.hidden, dtype=spec.out_dtype, device=dev)
        rec = new_rec()
        for i in range(iters + 10):
            sync_round()
            t0 = time.perf_counter_ns()
            dep = ds(x, ids, None, scale, None, n, ctx)
            t1 = time.perf_counter_ns()
            outs = dr(dep, ctx, code, False)
            t2 = time.perf_counter_ns()
            t3 = time.perf_counter_ns()
            dep2 = cs(y, None, outs[5], ids, None, n, outb, ctx)
            t4 = time.perf_counter_ns()
            cr(dep2, ids, None, n, outb, ctx)
            t5 = time.perf_counter_ns()
            sync_round()
            t6 = time.perf_counter_ns()
            outs = dw(x, ids, None, scale, None, n, ctx, code, False)
            t7 = time.perf_counter_ns()
            cr(cs(y, None, outs[4], ids, None, n, outb, ctx), ids, None, n, outb, ctx)  # the round's combine, untimed
            if i >= 10:
                for k, a, b in (("dispatch_send", t0, t1), ("dispatch_recv", t1, t2), ("combine_send", t3, t4),
                                ("combine_recv", t4, t5), ("dispatch_whole", t6, t7)):
                    rec.setdefault(k, []).append(b - a)
        be.check_error()
        collect("raw_op", rec)

    def run_refs():
        ops = torch.ops.moe_backend
        small = torch.zeros(1, device=dev)
        ev = torch.cuda.Event()
        cases = {
            "op_no_tensor(n_pes)": lambda: ops.n_pes.default(),
            "aten.alias.default": lambda: torch.ops.aten.alias.default(small),
            "torch.empty(gpu, 14MB)": lambda: torch.empty(2048, spec.hidden, dtype=FP8, device=dev),
            "torch.empty(gpu, 1 elt)": lambda: torch.empty(1, device=dev),
            "x.zero_() (1 launch)": lambda: small.zero_(),
            "event.record()": lambda: ev.record(),
        }
        for name, fn in cases.items():
            for _ in range(50):
                fn()
            ns = []
            for _ in range(iters):
                t0 = time.perf_counter_ns()
                fn()
                ns.append(time.perf_counter_ns() - t0)
            torch.cuda.synchronize()
            res["times_us"][f"ref.{name}"] = _stats(ns)
        small_ns, params_ns, params_bytes = ops.launch_cost.default(iters, dev.index)
        res["launch_cost_ns"] = {"args_8_bytes": small_ns, "args_params": params_ns, "params_bytes": params_bytes}

    def run_profiler():
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=acts, record_shapes=False) as prof:
            comm_rounds(30, None)
        ka = prof.key_averages()
        # The per-round synchronisation and barrier (outside the timed windows above) are in the
        # trace too; the first list leaves them out.
        skip = ("synchron", "barrier", "nccl", "all_reduce", "record_param_comms", "c10d", "Memcpy", "Memset")
        rows = [e for e in ka if not any(s.lower() in e.key.lower() for s in skip) and e.self_cpu_time_total > 0]
        rows.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
        text.append(f"== rank {rank}: torch.profiler, 30 Communicator rounds: top CPU ops by self time "
                    "(sync/barrier/NCCL rows left out)")
        text.append(f"{'name':<64}{'calls':>7}{'self us/call':>14}{'self us total':>15}")
        for e in rows[:30]:
            text.append(f"{e.key[:63]:<64}{e.count:>7}{e.self_cpu_time_total / max(1, e.count):>14.2f}"
                        f"{e.self_cpu_time_total:>15.1f}")
        res["profiler_top"] = [(e.key, e.count, e.self_cpu_time_total) for e in rows[:30]]
        text.append("")
        text.append(f"== rank {rank}: full table (sort: self CPU)")
        text.append(ka.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60))

    section("comm", run_comm)
    section("backend", run_backend)
    section("raw_op", run_raw)
    section("refs", run_refs)
    section("profiler", run_profiler)
    try:
        torch.cuda.synchronize()
        be.check_error()
    except Exception:
        res["errors"]["final_check"] = traceback.format_exc(limit=4)

    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (res, text))
    if rank == 0:
        _write(out_dir, gathered)
    dist.barrier()
    try:
        comm.close()
    except Exception:
        pass


def _table(res: dict) -> list[str]:
    lines = [f"rank {res['rank']} (transport {res.get('transport')}): host us, median [p10, p90]"]
    for k, s in res["times_us"].items():
        if s:
            lines.append(f"  {k:<42} {s['median']:9.1f}  [{s['p10']:8.1f}, {s['p90']:8.1f}]")
    if "launch_cost_ns" in res:
        lc = res["launch_cost_ns"]
        lines.append(f"  launch of an empty kernel (C++, median ns): 8-byte args {lc['args_8_bytes']:.0f}, "
                     f"Params ({lc['params_bytes']:.0f} B) by value {lc['args_params']:.0f}")
    for k, e in res["errors"].items():
        lines.append(f"  ERROR in {k}:\n{e}")
    return lines


def _write(out_dir: str, gathered: list) -> None:
    os.makedirs(out_dir, exist_ok=True)
    commit = os.environ.get("MOE_BACKEND_COMMIT", "")
    doc = {"commit": commit, "shape": f"deepseek-decode fp8+scales/128, 128 tokens/rank, W={len(gathered)}",
           "ranks": [r for r, _ in gathered]}
    with open(os.path.join(out_dir, "profile_host.json"), "w") as f:
        json.dump(doc, f, indent=1)
    lines = [f"profile_host (commit {commit or '?'})"]
    for r, _ in gathered:
        lines += _table(r)
    summary = "\n".join(lines)
    print(summary, flush=True)
    with open(os.path.join(out_dir, "profile_host.txt"), "w") as f:
        f.write(summary + "\n\n")
        for _, text in gathered:
            f.write("\n".join(text) + "\n\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default=os.environ.get("OUT", "/tmp/moe_profile_host"))
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--timeout", type=float, default=150.0)
    ap.add_argument("--world-size", type=int, default=None, help="GPUs (processes); default 2, or 1 if only one")
    args = ap.parse_args()
    for k, v in (("NVSHMEM_DISABLE_NVLS", "1"), ("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
        os.environ.setdefault(k, v)
    os.makedirs(args.out, exist_ok=True)
    try:
        import torch

        world = args.world_size or min(2, torch.cuda.device_count())
        if world < 1 or torch.cuda.device_count() < world:
            print(f"profile_host: needs {max(world, 1)} CUDA GPU(s), {torch.cuda.device_count()} visible; "
                  "nothing measured", flush=True)
            return 0
        from moe_backend import launch

        launch.spawn(_worker, world, args.out, args.iters, dist_backend="nccl", timeout=args.timeout)
        return 0
    except Exception:
        msg = traceback.format_exc()
        print(msg, flush=True)
        path = os.path.join(args.out, "profile_host.txt")
        with open(path, "a") as f:  # the failure is the report
            f.write("profile_host FAILED:\n" + msg)
        return 1


if __name__ == "__main__":
    sys.exit(main())
