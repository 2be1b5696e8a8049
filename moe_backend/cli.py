"""`moe-backend`: info, bench, compare, selftest, train, train-bench and layer-bench.

`bench` and `selftest` start their own local processes (gloo on CPU, NCCL when there is a
GPU per rank) unless already running under torchrun, in which case they use its ranks.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from . import bench as benchmod
from . import latency_floor, sm_ceilings
from .backends import nvshmem_available
from .bench_compare import WHOLE_OPS, BenchCompareError, compare, format_comparison
from .cli_args import nonnegative_float, nonnegative_int, positive_int
from .config import WARM_BY, BenchPreset, ConfigError, bench_presets_dir, load_bench, resolve_config
from .launch import run_everywhere, under_torchrun


def say(msg: str) -> None:
    """Progress line from rank 0 only (every rank when not distributed)."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"[moe-backend {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def resolve_preset(name: str) -> Path:
    return resolve_config(name, bench_presets_dir())


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# -- info -----------------------------------------------------------------------------------
def cmd_info(args: argparse.Namespace) -> int:
    from . import __version__

    print(f"moe_backend {__version__}; python {sys.version.split()[0]}; torch {torch.__version__}")
    for pkg in ("megatron-core", "nvidia-nvshmem-cu13", "nvshmem4py-cu13"):
        print(f"  {pkg}: {_version(pkg)}")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(f"CUDA devices: {n}")
    for i in range(n):
        print(f"  [{i}] {torch.cuda.get_device_name(i)}")
    if n > 1:
        print("P2P access matrix (row can access column):")
        for i in range(n):
            peer = torch.cuda.can_device_access_peer
            row = " ".join("x" if i == j else str(int(peer(i, j))) for j in range(n))
            print(f"  [{i}] {row}")
    ok, why = nvshmem_available()
    print(f"nvshmem backend: {'available' if ok else 'unavailable (' + why + ')'}")
    print(f"backend 'auto' picks: {'nvshmem' if ok else 'reference'}")
    preset = load_bench(resolve_preset(args.config))
    world = args.world_size or preset.bench.world_size
    try:
        spec = preset.comm.to_spec(world)
    except ValueError as err:
        raise ConfigError(f"{preset.name} at world size {world}: {err}") from None
    print(f"config {preset.name} at world size {world}: {spec.describe()}")
    print(f"  local experts {spec.num_local_experts}, groups {spec.num_groups}, "
          f"max rows received per rank {spec.max_recv_tokens}")
    # The nvshmem backend's one buffer formula; importable without the extension.
    from .backends.nvshmem_runtime import buffer_bytes, padded_region_bytes, padded_unsupported

    for transport in ("put", "nvlink"):
        print(f"  nvshmem buffers per rank, {transport} transport (bytes; docs/KERNELS.md):")
        for name, size in buffer_bytes(spec, transport).items():
            print(f"    {name:<28}{size:>16,}")
    why_not = padded_unsupported(spec, "nvlink")
    if why_not is None:
        print(f"  padded layout (nvlink, at the first dispatch_padded): {padded_region_bytes(spec):,} symmetric bytes "
              "per rank more")
    else:
        print(f"  padded layout: derived from the contiguous ops ({why_not})")
    return 0


# -- bench ----------------------------------------------------------------------------------
def _bench_body(presets: list[BenchPreset], backend: str, out: str | None, plot: str | None,
                sms: list[int] | None) -> None:
    reports = []
    copy_rate = benchmod.measure_copy_rate()
    memory_rates = benchmod.measure_local_memory_rates()
    gpu_kernels = backend in ("all", "nvshmem", "auto")
    floor = latency_floor.measure(benchmod.bench_device()) if gpu_kernels else None
    ceilings = sm_ceilings.measure(benchmod.bench_device(), sms or ()) if gpu_kernels else None
    for preset in presets:
        report = benchmod.run(preset, backend, say, copy_rate, sms or ())
        report["latency_floor_us"] = floor
        report["local_memory_gbps"] = memory_rates
        report["sm_ceilings_gbps"] = ceilings
        benchmod.add_ratios(report)
        reports.append(report)
        say("\n" + benchmod.format_table(report))
    if dist.get_rank() == 0 and out:
        benchmod.write_json(out, reports)
        say(f"wrote {out}")
    if dist.get_rank() == 0 and plot:
        from .bench_plot import plot_latency

        why_not = plot_latency(reports, plot)
        say(f"no plot: {why_not}" if why_not else f"wrote {plot}")


def require_backend(backend: str) -> None:
    """`--backend nvshmem` where it cannot run: one clear error before any process starts."""
    if backend == "nvshmem":
        ok, why = nvshmem_available()
        if not ok:
            raise ConfigError(f"--backend nvshmem: unavailable here ({why}); use 'auto' or 'reference'")


def cmd_bench(args: argparse.Namespace) -> int:
    require_backend(args.backend)
    names = sorted(p.stem for p in bench_presets_dir().glob("*.yaml")) if args.all_presets else [args.config]
    presets = []
    for name in names:
        preset = load_bench(resolve_preset(name))
        if args.iters is not None:
            preset.bench.iters = args.iters
        if args.warmup is not None:
            preset.bench.warmup = args.warmup
        if args.num_tokens:
            preset.bench.num_tokens = args.num_tokens
        if args.world_size:
            preset.bench.world_size = args.world_size
        preset.bench.apply_warm_flags(args.warm_inputs, args.warm_by)
        preset.validate()
        presets.append(preset)
    return _launch(_bench_body, presets[0].bench.world_size, presets, args.backend, args.out, args.plot, args.sms)


# -- selftest -------------------------------------------------------------------------------
def _selftest_body(backend: str, seed: int, tp_sizes: list[int]) -> None:
    from .testing import contract_matrix

    # Under torchrun every rank drew its own fresh seed: the inputs must be rank 0's on all.
    agreed = [seed]
    dist.broadcast_object_list(agreed, src=0)
    seed = agreed[0]
    say(f"selftest seed {seed}")
    for tp in tp_sizes:
        count = contract_matrix(backend, tp, seed)
        say(f"selftest: backend {backend}, tp_size {tp}: {count} contract cases passed bit for bit")


def selftest_tp_sizes(requested: list[int] | None, world: int) -> list[int]:
    """The attention-TP sizes to check: each must divide the world size (default: 1 and 2
    where 2 divides it)."""
    if requested is None:
        return [tp for tp in (1, 2) if world % tp == 0]
    bad = [tp for tp in requested if world % tp]
    if bad:
        raise ConfigError(f"--tp-size {bad} does not divide the world size {world}")
    return requested


def cmd_compare(args: argparse.Namespace) -> int:
    """Exit 0: nothing slower; 1: some median slower past both limits; 2: a bad file."""
    try:
        cmp = compare(args.old, args.new, tuple(args.phases), tuple(args.backends) if args.backends else None)
    except BenchCompareError as err:
        print(f"moe-backend compare: {err}", file=sys.stderr)
        return 2
    print(format_comparison(cmp, args.tolerance, args.min_us))
    return 1 if cmp.slower(args.tolerance, args.min_us) else 0


def cmd_selftest(args: argparse.Namespace) -> int:
    require_backend(args.backend)
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else args.world_size
    tp_sizes = selftest_tp_sizes(args.tp_size, world)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    return _launch(_selftest_body, args.world_size, args.backend, seed, tp_sizes)


def _launch(fn: Any, world: int, *args: Any) -> int:
    run_everywhere(fn, world, *args, timeout=3600, announce=say)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moe-backend", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="versions, devices, P2P matrix, NVSHMEM, buffer sizes for a config")
    info.add_argument("--config", default="deepseek_decode", help="bench preset name or YAML path")
    info.add_argument("--world-size", type=positive_int, help="group size for the sizes (default: the preset's)")
    info.set_defaults(fn=cmd_info)

    b = sub.add_parser("bench", help="time dispatch/combine and their halves for a preset")
    b.add_argument("--config", default="deepseek_decode", help="preset name in configs/bench or a YAML path")
    b.add_argument("--all-presets", action="store_true", help="run every preset in configs/bench")
    b.add_argument("--backend", default="auto", choices=["auto", "reference", "nvshmem", "all"])
    b.add_argument("--world-size", type=positive_int, help="local processes to start (ignored under torchrun)")
    b.add_argument("--iters", type=positive_int, help="override the preset's measured iterations")
    b.add_argument("--warmup", type=nonnegative_int, help="override the preset's warm-up iterations")
    b.add_argument("--num-tokens", type=positive_int, nargs="+", help="override the preset's tokens per rank")
    b.add_argument("--warm-inputs", action="store_true",
                   help="read each timed call's inputs once before it, outside the timing (hot in L2, as in a "
                        "model's step; default: cold after the barrier's device sleep)")
    b.add_argument("--warm-by", choices=WARM_BY,
                   help="how --warm-inputs touches the inputs (implies it): read each once (clean in L2, the "
                        "default) or rewrite each in place, bits unchanged (dirty, as the kernel that made it); "
                        "scratch: the control, a buffer of each input's size read instead (the inputs stay cold); "
                        f"launch: the same kernels reading {benchmod.LAUNCH_CONTROL_BYTES} bytes each; "
                        "launch-out: those into an output made once (nothing from the allocator); "
                        f"fill: as many kernels filling {benchmod.LAUNCH_CONTROL_BYTES} bytes each, no reduction "
                        "(the inputs stay cold)")
    b.add_argument("--out", help="write the results as JSON here")
    b.add_argument("--plot", help="write a PNG of latency against tokens per rank here")
    b.add_argument("--sms", type=positive_int, nargs="+", metavar="N",
                   help="also time nvshmem-nvlink with its kernels sized for only N SMs (rows nvshmem-nvlink-<N>sm), "
                        "and measure what N SMs can load, store and store over NVLink")
    b.set_defaults(fn=cmd_bench)

    c = sub.add_parser("compare", help="two bench JSON files side by side; exit 1 if a median got slower")
    c.add_argument("old", help="the baseline: a `bench --out` file")
    c.add_argument("new", help="the run to check against it")
    c.add_argument("--phases", nargs="+", default=list(WHOLE_OPS), metavar="PHASE",
                   help="phases to compare (default: the whole ops, dispatch combine; also e.g. combine_recv)")
    c.add_argument("--backends", nargs="+", metavar="BACKEND",
                   help="compare only these backends' rows (e.g. nvshmem-nvlink nvshmem-put; default: all)")
    c.add_argument("--tolerance", type=nonnegative_float, default=0.03,
                   help="slower means more than this fraction of the old median (default 0.03) ...")
    c.add_argument("--min-us", type=nonnegative_float, default=1.0,
                   help="... and more than this many microseconds (default 1.0)")
    c.set_defaults(fn=cmd_compare)

    s = sub.add_parser("selftest", help="run the contract checks across processes")
    s.add_argument("--backend", default="auto", choices=["auto", "reference", "nvshmem"])
    s.add_argument("--world-size", type=positive_int, default=2)
    s.add_argument("--tp-size", type=positive_int, nargs="+",
                   help="attention-TP sizes to check; each must divide the world size (default: 1 and 2)")
    s.add_argument("--seed", type=int, help="input seed (default: fresh)")
    s.set_defaults(fn=cmd_selftest)
    from .training.cli import add_train_bench_parser, add_train_parser  # lazy: megatron is optional
    add_train_parser(sub)
    add_train_bench_parser(sub)
    from .layer_bench import add_layer_bench_parser  # lazy: megatron is imported inside the run
    add_layer_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as err:
        print(f"moe-backend: config error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
