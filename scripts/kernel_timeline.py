"""Where a dispatch's and a combine's time goes on each GPU (diagnostic).

Runs a bench preset (default deepseek_decode, nvlink transport) on 2 local GPUs (or
--world-size N; 1 times the kernels' own chain with no link in it) with the
kernels' timeline stamps on (op `timeline_stamps`: each kernel's first and last block entry
and last warp exit by %globaltimer, the plan's end of waiting, of its grid barrier, of its
count sums and of its scan, the combine send's warps at their first item, row map, sums,
fence and end of send items)
and prints, per token count, the medians over the iterations of
- dispatch: each kernel's entry / exit relative to the send kernel's first entry;
- combine: each kernel's entry / exit relative to the combine send's first entry;
- the timer's step (the gcd of the stamps' distances; gaps below it are quantisation);
- beside them the CUDA-event time of the whole op, timed as the benchmark does (GPU barrier,
  events around send + receive): the difference is launch latency outside the kernels.

    python scripts/kernel_timeline.py [--config deepseek_decode] [--tokens 1 128] [--sms N]
                                      [--world-size 2] [--iters 100] [--out timeline.json] [--split | --padded]

The dispatch is the whole `comm.dispatch` (one fused kernel at decode sizes since round 35: the
send's stamps, then the receive's, in one kernel); `--split` times `dispatch_send` + `recv`;
`--padded` times `comm.dispatch_padded` / `combine_padded` (their kernels' stamps: masks built,
rows and counts stored, counts seen; the combine's pair scan and send items done).

The stamps cost time even when off, so only a build with them has them:
    rm -f moe_backend/_C*.so && MOE_BACKEND_STAMPS=1 python setup.py build_ext --inplace
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moe_backend import bench, launch  # noqa: E402
from moe_backend.communicator import Communicator  # noqa: E402
from moe_backend.config import WARM_BY, bench_presets_dir, load_bench, resolve_config  # noqa: E402

STAMPS = ["send", "plan", "plan_waited", "copy", "combine_send", "combine_send_items", "combine_recv",
          "plan_barrier", "combine_send_summed", "combine_send_fenced", "combine_send_loop",
          "combine_send_rows", "send_table", "direct_rows", "table_masks", "table_entries", "recv_start",
          "direct_copied", "plan_summed", "plan_scanned", "pad_dispatch", "pad_masks", "pad_rows", "pad_counts",
          "pad_combine", "pad_scanned", "pad_sent", "pad_empty_counts", "pad_copied", "pad_slots_in",
          "pad_rows_in"]  # the kernels' enum Stamp order
DISPATCH = ["send", "table_masks", "table_entries", "send_table", "recv_start", "plan", "plan_waited", "plan_barrier",
            "plan_summed", "plan_scanned", "direct_rows", "direct_copied", "copy"]
COMBINE = ["combine_send", "combine_send_loop", "combine_send_rows", "combine_send_summed", "combine_send_fenced",
           "combine_send_items", "combine_recv"]
PADDED_DISPATCH = ["pad_dispatch", "pad_masks", "pad_copied", "pad_rows", "pad_empty_counts",
                   "pad_counts"]  # --padded: dispatch_padded
PADDED_COMBINE = ["pad_combine", "pad_scanned", "pad_slots_in", "pad_rows_in", "pad_sent"]  # and combine_padded
# stamps that record one moment (the latest over warps), not a kernel
EXIT_ONLY = ("send_table", "direct_rows", "plan_waited", "plan_barrier", "combine_send_items", "table_masks",
             "table_entries", "recv_start", "direct_copied", "plan_summed", "plan_scanned",
             "combine_send_summed", "combine_send_fenced", "combine_send_loop", "combine_send_rows",
             "pad_masks", "pad_rows", "pad_counts", "pad_scanned", "pad_sent", "pad_empty_counts", "pad_copied",
             "pad_slots_in", "pad_rows_in")
WARMUP = 10


def _relative(stamps: list[int], names: list[str]) -> dict[str, float]:
    """First / last block entry and last exit of each named kernel, in us after the first
    kernel's first entry (-1: none)."""
    t0 = stamps[3 * STAMPS.index(names[0])]
    out = {}
    for name in names:
        k = STAMPS.index(name)
        first, last, leave = stamps[3 * k: 3 * k + 3]
        if name not in EXIT_ONLY:
            out[f"{name}_entry"] = (first - t0) / 1e3 if first >= 0 else -1.0
            out[f"{name}_last_entry"] = (last - t0) / 1e3 if last > 0 else -1.0
        out[f"{name}_exit"] = (leave - t0) / 1e3 if leave > 0 else -1.0
    return out


def _worker(config: str, tokens: list[int] | None, sms: int | None, transport: str, iters: int,
            out: str | None, split: bool, padded: bool = False, warm_inputs: bool = False,
            warm_by: str | None = None) -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    preset = load_bench(resolve_config(config, bench_presets_dir()))
    preset.bench.apply_warm_flags(warm_inputs, warm_by)
    warm = preset.bench.warm_mode()
    spec = preset.comm.to_spec(dist.get_world_size())
    options = {"transport": transport} | ({"num_sms": sms} if sms else {})
    comm = Communicator(spec, backend="nvshmem", device=device, check_inputs=False, **options)
    tokens = tokens or preset.bench.num_tokens
    ops = torch.ops.moe_backend
    clock, flag = bench.Clock(device), torch.ones(1, device=device)
    report: dict[str, dict] = {}
    step = 0
    for n in tokens:
        x, ids, _, scale = bench.make_routing(spec, n, preset.bench.seed, device)
        samples: dict[str, list[float]] = {}
        y = None
        for i in range(WARMUP + iters):
            ops.timeline_stamps(1)  # reset and on (synchronises)
            bench.barrier(device, flag, (x, ids, scale), warm)
            m0 = clock.mark()
            if padded:  # one kernel each way (csrc/padded_kernels.cuh)
                result = comm.dispatch_padded(x, ids, None, scale)
            elif split:  # the two kernels of the split phases
                result = comm.dispatch_send(x, ids, None, scale).recv()
            else:  # the whole op, fused where the direct receive runs (send stamps, then receive's)
                result = comm.dispatch(x, ids, None, scale)
            m1 = clock.mark()
            if y is None:
                y = torch.randn(result.tokens.shape[:-1] + (spec.hidden,), device=device).to(spec.out_dtype)
            if padded:  # its filled rows, in place (the whole is past bench.WARM_MAX_BYTES)
                bench.touch_padded_filled_rows(y, result.counts, warm)
            bench.barrier(device, flag, () if padded else (y,), warm)
            m2 = clock.mark()
            if padded:
                comm.combine_padded(y, result.handle)
            else:
                comm.combine_send(y, result.handle, None).recv()
            m3 = clock.mark()
            stamps = ops.timeline_stamps(0).tolist()
            if i < WARMUP:
                continue
            # The timer's step: the gcd of every stamp's distance from the first (a step of
            # ~1 us would make the sub-us gaps below quantisation, not time).
            ref = stamps[0]
            for v in stamps:
                if v > 0 and ref > 0:
                    step = math.gcd(step, abs(v - ref))
            row = {"dispatch_events": clock.elapsed_us(m0, m1), "combine_events": clock.elapsed_us(m2, m3)}
            dispatch_names, combine_names = (PADDED_DISPATCH, PADDED_COMBINE) if padded else (DISPATCH, COMBINE)
            row.update({f"dispatch.{k}": v for k, v in _relative(stamps, dispatch_names).items()})
            row.update({f"combine.{k}": v for k, v in _relative(stamps, combine_names).items()})
            for k, v in row.items():
                samples.setdefault(k, []).append(v)
        report[str(n)] = {k: statistics.median(v) for k, v in samples.items()}
    comm.close()
    report["timer_step_ns"] = {"gcd": step}
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, report)
    if dist.get_rank() == 0:
        steps = " ".join(str(g["timer_step_ns"]["gcd"]) for g in gathered)
        print(f"%globaltimer step (gcd of the stamps' distances, ns, per rank): {steps}")
        for n in tokens:
            print(f"== {preset.name}, {transport}{f', {sms} SMs' if sms else ''}, {n} tokens per rank "
                  "(median us per rank; kernels relative to the first kernel's entry)")
            for key in gathered[0][str(n)]:
                print(f"  {key:<32}" + "".join(f"{g[str(n)][key]:>10.1f}" for g in gathered))
        if out:
            bench.write_json(out, [{"preset": preset.name, "tool": "kernel_timeline", "transport": transport,
                                    "dispatch": "padded" if padded else "split" if split else "whole",
                                    "warm_inputs": bool(warm), "warm_by": warm or None,
                                    "world_size": dist.get_world_size(),
                                    "num_sms": sms, "per_rank": gathered}])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="deepseek_decode", help="bench preset name or YAML path")
    ap.add_argument("--tokens", type=int, nargs="+", help="tokens per rank (default: the preset's)")
    ap.add_argument("--sms", type=int, help="size the kernels for this many SMs")
    ap.add_argument("--transport", default="nvlink", choices=["nvlink", "put"])
    ap.add_argument("--world-size", type=int, default=2, help="local GPUs (one process each)")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--out", help="write the medians per rank as JSON here")
    ap.add_argument("--split", action="store_true",
                    help="dispatch by send + receive (two kernels), not the whole comm.dispatch")
    ap.add_argument("--padded", action="store_true",
                    help="time dispatch_padded / combine_padded (the padded layout's kernels) instead")
    ap.add_argument("--warm-inputs", action="store_true",
                    help="read each call's inputs once before its barrier (as `moe-backend bench --warm-inputs`)")
    ap.add_argument("--warm-by", choices=WARM_BY,
                    help="how --warm-inputs touches them (implies it; as `moe-backend bench --warm-by`)")
    args = ap.parse_args()
    if not 1 <= args.world_size <= torch.cuda.device_count():
        ap.error(f"--world-size {args.world_size}: this machine has {torch.cuda.device_count()} GPU(s)")
    launch.spawn(_worker, args.world_size, args.config, args.tokens, args.sms, args.transport, args.iters, args.out,
                 args.split, args.padded, args.warm_inputs, args.warm_by, dist_backend="nccl",
                 timeout=600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
