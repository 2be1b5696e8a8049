#!/usr/bin/env python3
"""GPU timeline of one dispatch + combine round of the nvshmem backend (torch.profiler).

On 2 GPUs (2 NCCL processes; --world-size N), for each case (preset shape, tokens/rank, transport, overlap),
the benchmark's own loop (GPU-side barrier: device sleep + one-element all-reduce, then
dispatch send/recv, barrier, combine send/recv), a few warm-up rounds, then 5 rounds (or
`--rounds N`, if more) under torch.profiler. Rank 0 prints, for the last profiled round (or the
medians of the last N), every GPU activity (kernel, memcpy, memset) after each barrier's
all-reduce: stream, start offset from the end of that all-reduce, duration. This shows the launch
gaps and which kernel is the critical path, which the CUDA-event phase times of `moe-backend bench`
cannot.

`--overlap N...` profiles the benchmark's overlap row instead (deepseek-sweep at N tokens/rank,
the send kernel on its own stream, the row's bf16 matmul (`bench.OVERLAP_MATMUL_DIM`) between send and receive):
whether the communication kernels launched with the send run beside the matmul or wait for its
blocks to drain. The nvshmem switches come from the environment (read when an arena is made).

`--whole` profiles the whole ops (`dispatch`, `combine`) in place of the split send and receive;
`--warm-by MODE` touches each op's inputs before the barrier as `moe-backend bench --warm-inputs
--warm-by MODE` does (default: cold): where the whole ops' warm penalty shows, the op's first
kernel starting later after the barrier, or running longer. `--rounds N` lists each activity's
median start and length over the last N profiled rounds in place of the last round as it ran: one
round cannot resolve a difference of a microsecond (run 57's timelines), N = 100 can.

Writes OUT_DIR/timeline.txt (rank 0). Each case runs under its own try/except.

    python3 scripts/profile_timeline.py OUT_DIR [PRESET_SUBSTRING] [--world-size N] [--overlap N...]
        [--whole] [--warm-by MODE] [--rounds N]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if os.path.isdir("/tmp/site") and "/tmp/site" not in sys.path:  # wheels gpu_check.sh installed
    sys.path.append("/tmp/site")

# (preset, tokens/rank, transport, overlap env value, matmul between send and receive)
CASES = [
    ("deepseek-decode", 1, "nvlink", "1", False),
    ("deepseek-decode", 128, "nvlink", "1", False),
    ("deepseek-decode", 128, "put", "1", False),
    ("deepseek-prefill", 4096, "nvlink", "1", False),
    ("deepseek-prefill", 4096, "nvlink", "0", False),
]


def _gpu_activities(trace_path: str) -> list[dict]:
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    keep = ("kernel", "gpu_memcpy", "gpu_memset")
    acts = [e for e in events if e.get("cat") in keep and "ts" in e]
    return sorted(acts, key=lambda e: e["ts"])


def _is_sleep(e: dict) -> bool:
    """The barrier's device sleep (`torch.cuda._sleep`: ATen's spin kernel)."""
    return "spin" in e["name"].lower() or "sleep" in e["name"].lower()


def _sections(acts: list[dict]) -> list[tuple[str, list[dict]]]:
    """Each barrier's section: (op, the activities from the end of its all-reduce to the next
    barrier's), oldest first; the last barrier is a round's combine, the one before it its dispatch."""
    ar = [i for i, e in enumerate(acts) if "nccl" in e["name"].lower() and "allreduce" in e["name"].lower()]
    if len(ar) < 2:  # one rank: NCCL may launch nothing; the barrier's sleep kernel marks the rounds
        ar = [i for i, e in enumerate(acts) if _is_sleep(e)]
    ends = ar[1:] + [len(acts)]
    return [("combine" if (len(ar) - k) % 2 else "dispatch", [acts[i]] + acts[i + 1 : end])
            for k, (i, end) in enumerate(zip(ar, ends))]


def _listing(acts: list[dict], rounds: int = 1) -> list[str]:
    """The last `rounds` rounds' activities (dispatch, then combine), each from the end of its
    barrier: one round as it ran, or each activity's median start and length over the rounds
    (matched by place and name; `n` says in how many it ran where that is fewer)."""
    sections = _sections(acts)
    if len(sections) < 2:
        return ["(no barrier found in the trace)"]
    rounds = min(rounds, len(sections) // 2)
    lines: list[str] = []
    recent = sections[-2 * rounds :]  # dispatch, combine, dispatch, ... combine
    for chosen in (recent[0::2], recent[1::2]):
        label = chosen[0][0]
        per_place: dict[tuple[int, str], list[tuple[str, float, float]]] = {}
        for _, (barrier, *rest) in chosen:
            t0 = barrier["ts"] + barrier["dur"]
            kept = [e for e in rest if not _is_sleep(e)]
            for place, e in enumerate(kept):
                stream = str(e.get("args", {}).get("stream", "?"))
                per_place.setdefault((place, e["name"]), []).append((stream, e["ts"] - t0, e["dur"]))
        how = "" if rounds == 1 else f"; medians of {rounds} rounds"
        lines.append(f"  -- {label} (t=0: end of the barrier all-reduce{how})")
        for (_, name), seen in sorted(per_place.items()):
            start = statistics.median(s for _, s, _ in seen)
            dur = statistics.median(d for _, _, d in seen)
            count = f"  n {len(seen)}" if len(seen) < rounds else ""
            lines.append(f"    stream {seen[-1][0]:>4}  start {start:8.1f} us  dur {dur:8.1f} us  {name[:70]}{count}")
    return lines


def _profile_case(preset_name: str, n: int, transport: str, overlap: str, matmul: bool, rank: int,
                  whole: bool, warm: str, rounds: int) -> list[str]:
    import dataclasses

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from moe_backend import bench
    from moe_backend.communicator import Communicator
    from moe_backend.config import bench_presets_dir, load_bench, resolve_config

    dev = torch.device("cuda", torch.cuda.current_device())
    os.environ["MOE_BACKEND_NVSHMEM_OVERLAP"] = overlap  # read when an arena is created
    preset = load_bench(resolve_config(preset_name.replace("-", "_"), bench_presets_dir()))
    spec = dataclasses.replace(preset.comm.to_spec(dist.get_world_size()), max_num_tokens=n)
    comm = Communicator(spec, backend="nvshmem", device=dev, check_inputs=False, transport=transport,
                        send_stream=matmul)
    x, ids, _, scale = bench.make_routing(spec, n, 0, dev)
    y = torch.randn(spec.max_recv_tokens, spec.hidden, device=dev).to(spec.out_dtype)
    flag = torch.ones(1, device=dev)
    dim = bench.OVERLAP_MATMUL_DIM
    a = torch.randn(dim, dim, device=dev).to(torch.bfloat16) if matmul else None  # the overlap row's matmul

    def one_round() -> None:
        bench.barrier(dev, flag, (x, ids, scale), warm)
        if whole:
            res = comm.dispatch(x, ids, None, scale)
        else:
            receiver = comm.dispatch_send(x, ids, None, scale)
            if a is not None:
                torch.mm(a, a)
            res = receiver.recv()
        bench.barrier(dev, flag, (y,), warm)
        if whole:
            comm.combine(y, res.handle)
        else:
            comm.combine_send(y, res.handle).recv()

    for _ in range(20):
        one_round()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(max(5, rounds)):
            one_round()
        torch.cuda.synchronize()
    comm.close()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"trace{rank}.json")
        prof.export_chrome_trace(path)
        return _listing(_gpu_activities(path), rounds)


def select_cases(only: str, overlap_tokens: list[int]) -> list[tuple[str, int, str, str, bool]]:
    """The cases to profile: the overlap row at each of `overlap_tokens` if any, else CASES;
    those whose preset contains `only`."""
    cases = [("deepseek-sweep", n, "nvlink", "1", True) for n in overlap_tokens] or CASES
    return [case for case in cases if only in case[0]]


def _worker(out_dir: str, only: str, overlap_tokens: list[int], whole: bool, warm: str, rounds: int) -> None:
    import torch.distributed as dist

    rank = dist.get_rank()
    text: list[str] = []
    how = f", {'whole ops' if whole else 'split'}, {'warm by ' + warm if warm else 'cold'}"
    for preset_name, n, transport, overlap, matmul in select_cases(only, overlap_tokens):
        between = ", a matmul between send and receive" if matmul else ""
        text.append(f"== {preset_name} {n} tokens/rank, {transport}, overlap={overlap}{between}{how}")
        try:
            text += _profile_case(preset_name, n, transport, overlap, matmul, rank, whole, warm, rounds)
        except Exception:
            text.append(traceback.format_exc(limit=6))
        dist.barrier()
    if rank == 0:
        with open(os.path.join(out_dir, "timeline.txt"), "w") as f:
            f.write("\n".join(text) + "\n")
        print("\n".join(text))


def main() -> None:
    import argparse

    from moe_backend.config import WARM_BY
    from moe_backend.launch import spawn

    ap = argparse.ArgumentParser(description="GPU timeline of one dispatch + combine round (torch.profiler)")
    ap.add_argument("out_dir", nargs="?", default=".")
    ap.add_argument("only", nargs="?", default="", help='cases whose preset contains this, e.g. "prefill"')
    ap.add_argument("--world-size", type=int, default=2, help="local GPUs, one process each (1: no link)")
    ap.add_argument("--overlap", type=int, nargs="+", default=[], metavar="N",
                    help="profile the overlap row (send stream, matmul between) at these tokens/rank instead")
    ap.add_argument("--whole", action="store_true", help="the whole ops (dispatch, combine), not send + receive")
    ap.add_argument("--warm-by", choices=WARM_BY, default="",
                    help="touch each op's inputs before the barrier this way, as bench --warm-by (default: cold)")
    ap.add_argument("--rounds", type=int, default=1, metavar="N",
                    help="list each activity's median start and length over the last N profiled rounds "
                         "(default 1: the last round as it ran)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.whole and args.overlap:
        ap.error("--whole and --overlap exclude each other (the overlap row splits send and receive)")
    os.makedirs(args.out_dir, exist_ok=True)
    spawn(_worker, args.world_size, args.out_dir, args.only, args.overlap, args.whole, args.warm_by, args.rounds,
          dist_backend="nccl", timeout=300)


if __name__ == "__main__":
    main()
