"""The training loop of one rank: build, run N steps, report, write the logs (rank 0)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..train_config import TrainConfig, check_device, check_world
from . import dispatchers, report
from .data import mock_batch
from .model import build_gpt, layer_spec, moe_layers, transformer_config
from .optim import MixedPrecisionAdamW, global_grad_norm, lr_at, reduce_grads
from .profiling import StepProfiler
from .timing import CommTimer, instrument_model


def pick_device() -> torch.device:
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _aux_loss(num_moe_layers: int) -> float | None:
    """Load-balancing loss (unscaled, averaged over MoE layers) recorded by the routers this step."""
    from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

    tracker = get_moe_metrics_tracker()
    entry = tracker.metrics.get("load_balancing_loss")
    value = None if entry is None else float(entry.values.sum().item()) / max(1, num_moe_layers)
    tracker.clear()
    return value


def _reduce(values: list[float], op: Any, device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def prepare_rank(cfg: TrainConfig) -> torch.device:
    """Check the config against this launch and pick this rank's device (process group up)."""
    world = dist.get_world_size()
    check_world(cfg, world)
    device = pick_device()
    check_device(cfg, device.type == "cuda")
    if device.type == "cpu":
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))
    return device


@contextlib.contextmanager
def model_parallel(cfg: TrainConfig) -> Iterator[None]:
    """Megatron's TP/EP/DP groups for the body; our communicators and the groups freed after."""
    from megatron.core import parallel_state as ps

    p = cfg.parallel
    ps.initialize_model_parallel(
        tensor_model_parallel_size=p.tp, expert_model_parallel_size=p.ep, expert_tensor_parallel_size=p.expert_tp
    )
    try:
        yield
    finally:
        dispatchers.release()
        ps.destroy_model_parallel()


class RankTrainer:
    """This rank's part of one model trained with one dispatcher: built once, then stepped.

    Needs the model-parallel groups (`model_parallel`) for its whole life. Several may live
    side by side (`train-bench --schedule interleaved`): each has its own model, optimizer,
    timer and log, built from the same seed.
    """

    def __init__(self, cfg: TrainConfig, device: torch.device, show: bool = True,
                 profile_dir: str | None = None, profile_device_only: bool = False):
        from megatron.core import parallel_state as ps

        self.cfg, self.device = cfg, device
        self.name = dispatchers.resolve(cfg.dispatcher, device.type == "cuda")
        self.show = show and dist.get_rank() == 0
        torch.manual_seed(cfg.train.seed)
        if device.type == "cuda":
            from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(cfg.train.seed)
        tconfig = transformer_config(cfg, dispatchers.megatron_type(self.name))
        spec = dispatchers.with_dispatcher(layer_spec(cfg), self.name, cfg.dispatcher_options)
        self.model = build_gpt(cfg, tconfig, spec, device)
        self.layers = moe_layers(self.model)
        self.timer = CommTimer(device)
        instrument_model(self.layers, self.timer)
        params = [q for q in self.model.parameters() if q.requires_grad]
        self.opt = MixedPrecisionAdamW(params, cfg.train.lr, cfg.train.weight_decay)
        self.log = report.RunLog(cfg, self.name, device, dist.get_world_size(), sum(q.numel() for q in params))
        if self.show:
            report.say(self.log.header())
            ignored = dispatchers.ignored_options(self.name, cfg.dispatcher_options)
            if ignored:
                report.say(f"note: dispatcher_options {ignored} do not apply to the {self.name} dispatcher; ignored")
        self.profiler = StepProfiler(profile_dir, start=cfg.train.timing_warmup, device_only=profile_device_only)
        self.dp_rank = ps.get_data_parallel_rank()
        r, m = cfg.train, cfg.model
        self.positions = torch.arange(m.seq_length, device=device).unsqueeze(0).expand(r.micro_batch_size, -1)
        self.model.train()

    def step(self, step: int) -> dict[str, Any]:
        """One optimizer step; returns its log record (loss, times: the slowest rank's)."""
        r, m, device = self.cfg.train, self.cfg.model, self.device
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        tokens, labels = (t.to(device) for t in mock_batch(r.seed, step, self.dp_rank, r.micro_batch_size,
                                                           m.seq_length, m.vocab_size))
        sync()
        self.profiler.before(step)
        t0 = time.perf_counter()
        per_token = self.model(tokens, self.positions, None, labels=labels)  # [b, s] cross entropy
        loss = per_token.float().mean()
        loss.backward()
        reduce_grads(self.opt.params)
        norm = global_grad_norm(self.opt.params)
        lr = lr_at(step, r.steps, r.lr, r.min_lr, r.warmup_steps)
        self.opt.step(lr, r.grad_clip, norm)
        self.opt.zero_grad()
        sync()
        elapsed = time.perf_counter() - t0
        self.profiler.after(step, dist.get_rank(), last=step == r.steps - 1)
        comm = self.timer.collect()
        aux = _aux_loss(len(self.layers))
        # Loss: mean over ranks (TP peers agree; equals the DP mean). Times: the slowest rank.
        loss_avg, aux_avg = _reduce([loss.item(), aux or 0.0], dist.ReduceOp.SUM, device)
        slowest = _reduce([elapsed, *comm.values()], dist.ReduceOp.MAX, device)
        world = dist.get_world_size()
        rec = self.log.add(step, loss_avg / world, aux_avg / world if aux is not None else None, lr, norm,
                           slowest[0], dict(zip(comm, slowest[1:])))
        if self.show:
            report.say(report.step_line(rec, r.steps))
        return rec

    def finish(self, out_dir: str | None) -> dict[str, Any] | None:
        """The run's log on rank 0 (written to out_dir when given); None on other ranks."""
        if dist.get_rank() != 0:
            return None
        result = self.log.finish()
        if out_dir:
            paths = report.write(result, Path(out_dir))
            if self.show:
                report.say(f"wrote {', '.join(str(q) for q in paths)}")
        return result


def train_rank(cfg: TrainConfig, out_dir: str | None, progress: bool = True,
               profile_dir: str | None = None, profile_device_only: bool = False) -> dict[str, Any] | None:
    """Train on this rank (process group already initialised). Rank 0 returns the log.

    profile_dir: profile 3 steps after the timing warm-up there (see profiling.py);
    profile_device_only: record kernels only (no host operator events).
    """
    device = prepare_rank(cfg)
    with model_parallel(cfg):
        trainer = RankTrainer(cfg, device, progress, profile_dir, profile_device_only)
        for step in range(cfg.train.steps):
            trainer.step(step)
    return trainer.finish(out_dir)
