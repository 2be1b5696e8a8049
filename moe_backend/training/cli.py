"""`moe-backend train` and `moe-backend train-bench` (parsers and launch).

Both start their own local processes (gloo on CPU, NCCL with a GPU per rank), or use
torchrun's ranks when run under torchrun (as the Slurm launcher does).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..cli_args import positive_int
from ..config import ConfigError
from ..launch import local_dist_backend, run_everywhere, under_torchrun
from ..train_config import DISPATCHERS, TrainConfig, check_device, load_train, resolve_train_config
from . import report


def load_with_overrides(args: argparse.Namespace) -> TrainConfig:
    cfg = load_train(resolve_train_config(args.config))
    for key, value in (("dispatcher", getattr(args, "dispatcher", None)),):
        if value is not None:
            setattr(cfg, key, value)
    if args.steps is not None:
        cfg.train.steps = args.steps
        cfg.train.timing_warmup = min(cfg.train.timing_warmup, max(0, args.steps - 1))
    if args.world_size is not None:
        cfg.parallel.world_size = args.world_size
    if args.ep is not None:
        cfg.parallel.ep = args.ep
    if under_torchrun():
        cfg.parallel.world_size = int(os.environ["WORLD_SIZE"])
    try:
        cfg.validate()
    except ConfigError as err:
        raise ConfigError(f"{args.config} (with command-line overrides): {err}") from None
    return cfg


def require_output_dir(path: str) -> None:
    """Refuse an output folder that is an existing file now, not after the whole run."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"output folder {path!r} is an existing file")


def quiet_megatron_warnings() -> None:
    """Megatron warns at import about optional fused kernels (Apex, TE) we do not use."""
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.")


def _train_body(cfg: TrainConfig, out_dir: str | None, progress: bool, profile_dir: str | None = None,
                profile_device_only: bool = False) -> None:
    quiet_megatron_warnings()
    from .loop import train_rank

    result = train_rank(cfg, out_dir, progress, profile_dir, profile_device_only)
    if result is not None and progress:
        report.say(report.summary_line(result))


def run_distributed(fn: Any, cfg: TrainConfig, *args: Any) -> None:
    """Run `fn(cfg, *args)` on every rank: torchrun's, or `world_size` local processes."""
    world = cfg.parallel.world_size
    if not under_torchrun():  # in the parent: a clear error, not one traceback per rank
        check_device(cfg, local_dist_backend(world) == "nccl")
    run_everywhere(fn, world, cfg, *args, timeout=3600, announce=report.say)


def cmd_train(args: argparse.Namespace) -> int:
    cfg = load_with_overrides(args)
    out = args.out or cfg.output.dir
    require_output_dir(out)
    if args.profile_device_only and not args.profile:
        raise SystemExit("--profile-device-only needs --profile DIR")
    run_distributed(_train_body, cfg, out, not args.quiet and cfg.output.progress, args.profile,
                    args.profile_device_only)
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="tiny", help="name in configs/train or a YAML path (default: tiny)")
    p.add_argument("--steps", type=positive_int, help="override train.steps")
    p.add_argument("--world-size", type=positive_int, help="local processes to start (ignored under torchrun)")
    p.add_argument("--ep", type=positive_int, help="override parallel.ep (e.g. --world-size 8 --ep 8 for EP8)")


def add_train_parser(subparsers: Any) -> None:
    t = subparsers.add_parser("train", help="train a Megatron-core GPT MoE model on mock data")
    _common(t)
    t.add_argument("--dispatcher", choices=DISPATCHERS, help="override the config's dispatcher")
    t.add_argument("--out", help="folder for train_log.json / train_log.csv (default: the config's output.dir)")
    t.add_argument("--quiet", action="store_true", help="no per-step progress lines")
    t.add_argument("--profile", metavar="DIR",
                   help="profile 3 steps after the timing warm-up; per-rank kernel summary in DIR")
    t.add_argument("--profile-device-only", action="store_true",
                   help="with --profile: record GPU kernels only (no host operators), so the host runs at "
                        "about its unprofiled speed")
    t.set_defaults(fn=cmd_train)


def add_train_bench_parser(subparsers: Any) -> None:
    from .bench import cmd_train_bench

    b = subparsers.add_parser("train-bench", help="step time of one model with each available dispatcher")
    _common(b)
    b.add_argument("--dispatchers", nargs="+", choices=DISPATCHERS[1:],
                   help="dispatchers to compare (default: every one available here)")
    b.add_argument("--out", default="out/train_bench", help="folder for table.txt, bench.json, bench.png")
    b.add_argument("--loss-rtol", type=float, default=0.02,
                   help="loss curves must agree within this relative tolerance (default 2%%)")
    b.add_argument("--schedule", choices=("interleaved", "sequential"), default="interleaved",
                   help="interleaved (default): every dispatcher's model built up front, one step of "
                        "each in turn, so host drift lands on all alike; sequential: each whole run in "
                        "turn, one model in memory at a time")
    b.set_defaults(fn=cmd_train_bench)
