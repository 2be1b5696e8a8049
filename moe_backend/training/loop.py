"""The training loop of one rank: build, run N steps, report, write the logs (rank 0)."""

from __future__ import annotations

import os
import time
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


def train_rank(cfg: TrainConfig, out_dir: str | None, progress: bool = True,
               profile_dir: str | None = None, profile_device_only: bool = False) -> dict[str, Any] | None:
    """Train on this rank (process group already initialised). Rank 0 returns the log.

    profile_dir: profile 3 steps after the timing warm-up there (see profiling.py);
    profile_device_only: record kernels only (no host operator events).
    """
    from megatron.core import parallel_state as ps

    world = dist.get_world_size()
    check_world(cfg, world)
    device = pick_device()
    check_device(cfg, device.type == "cuda")
    name = dispatchers.resolve(cfg.dispatcher, device.type == "cuda")
    rank0 = dist.get_rank() == 0
    if device.type == "cpu":
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))

    p = cfg.parallel
    ps.initialize_model_parallel(
        tensor_model_parallel_size=p.tp, expert_model_parallel_size=p.ep, expert_tensor_parallel_size=p.expert_tp
    )
    try:
        torch.manual_seed(cfg.train.seed)
        if device.type == "cuda":
            from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(cfg.train.seed)
        tconfig = transformer_config(cfg, dispatchers.megatron_type(name))
        spec = dispatchers.with_dispatcher(layer_spec(cfg), name, cfg.dispatcher_options)
        model = build_gpt(cfg, tconfig, spec, device)
        layers = moe_layers(model)
        timer = CommTimer(device)
        instrument_model(layers, timer)
        params = [q for q in model.parameters() if q.requires_grad]
        opt = MixedPrecisionAdamW(params, cfg.train.lr, cfg.train.weight_decay)
        log = report.RunLog(cfg, name, device, world, sum(q.numel() for q in params))
        if rank0 and progress:
            report.say(log.header())
        profiler = StepProfiler(profile_dir, start=cfg.train.timing_warmup, device_only=profile_device_only)
        _steps(cfg, model, layers, opt, timer, log, device, progress and rank0, ps.get_data_parallel_rank(), profiler)
    finally:
        dispatchers.release()
        ps.destroy_model_parallel()
    if not rank0:
        return None
    result = log.finish()
    if out_dir:
        paths = report.write(result, Path(out_dir))
        if progress:
            report.say(f"wrote {', '.join(str(q) for q in paths)}")
    return result


def _steps(cfg: TrainConfig, model: torch.nn.Module, layers: list[Any], opt: MixedPrecisionAdamW,
           timer: CommTimer, log: report.RunLog, device: torch.device, show: bool, dp_rank: int,
           profiler: StepProfiler) -> None:
    r, m = cfg.train, cfg.model
    model.train()
    positions = torch.arange(m.seq_length, device=device).unsqueeze(0).expand(r.micro_batch_size, -1)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for step in range(r.steps):
        tokens, labels = (t.to(device) for t in mock_batch(r.seed, step, dp_rank, r.micro_batch_size,
                                                           m.seq_length, m.vocab_size))
        sync()
        profiler.before(step)
        t0 = time.perf_counter()
        per_token = model(tokens, positions, None, labels=labels)  # [b, s] cross entropy
        loss = per_token.float().mean()
        loss.backward()
        reduce_grads(opt.params)
        norm = global_grad_norm(opt.params)
        lr = lr_at(step, r.steps, r.lr, r.min_lr, r.warmup_steps)
        opt.step(lr, r.grad_clip, norm)
        opt.zero_grad()
        sync()
        elapsed = time.perf_counter() - t0
        profiler.after(step, dist.get_rank(), last=step == r.steps - 1)
        comm = timer.collect()
        aux = _aux_loss(len(layers))
        # Loss: mean over ranks (TP peers agree; equals the DP mean). Times: the slowest rank.
        loss_avg, aux_avg = _reduce([loss.item(), aux or 0.0], dist.ReduceOp.SUM, device)
        slowest = _reduce([elapsed, *comm.values()], dist.ReduceOp.MAX, device)
        world = dist.get_world_size()
        rec = log.add(step, loss_avg / world, aux_avg / world if aux is not None else None, lr, norm,
                      slowest[0], dict(zip(comm, slowest[1:])))
        if show:
            report.say(report.step_line(rec, r.steps))
