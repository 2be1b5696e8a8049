"""Gradient reduction over Megatron's groups, global-norm clipping, AdamW with fp32 masters.

Megatron's own DDP and optimizer allocate on CUDA; this small replacement runs on gloo and
NCCL alike. Rules (as in Megatron's `finalize_model_grads`): sequence-parallel parameters
(norms, router) sum their gradients over the TP group; dense parameters average over the
data-parallel group; expert parameters (`allreduce=False`) over the expert-data-parallel
group. Gradients are reduced in one flat bucket per group.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def _groups() -> tuple[Any, Any, Any, Any, Any]:
    from megatron.core import parallel_state as ps

    return (
        ps.get_tensor_model_parallel_group(),
        ps.get_data_parallel_group(),
        ps.get_expert_data_parallel_group(),
        ps.get_expert_tensor_and_model_parallel_group(),
        ps.get_expert_tensor_parallel_group(),
    )


def _is_expert(p: torch.nn.Parameter) -> bool:
    return not getattr(p, "allreduce", True)


def _bucket_all_reduce(grads: list[torch.Tensor], group: Any, scale: float) -> None:
    if not grads:
        return
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    if scale != 1.0:
        flat.mul_(scale)
    for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        g.copy_(synced)


def reduce_grads(params: list[torch.nn.Parameter]) -> None:
    tp, dp, edp, _, _ = _groups()
    with_grad = [p for p in params if p.grad is not None]
    if dist.get_world_size(tp) > 1:
        sp = [p.grad for p in with_grad if getattr(p, "sequence_parallel", False) and not _is_expert(p)]
        _bucket_all_reduce(sp, tp, 1.0)
    buckets: dict[tuple[bool, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for p in with_grad:
        buckets[(_is_expert(p), p.grad.dtype)].append(p.grad)
    for (expert, _), grads in buckets.items():
        group = edp if expert else dp
        size = dist.get_world_size(group)
        if size > 1:
            _bucket_all_reduce(grads, group, 1.0 / size)


def global_grad_norm(params: list[torch.nn.Parameter]) -> float:
    """L2 norm of the whole model's gradient, each shard counted once."""
    tp, _, _, etmp, etp = _groups()
    sq = {False: 0.0, True: 0.0}
    device = None
    parts: dict[bool, list[torch.Tensor]] = {False: [], True: []}
    for p in params:
        if p.grad is None:
            continue
        device = p.grad.device
        expert = _is_expert(p)
        shard_group = etp if expert else tp
        # Replicated over the (expert-)TP group: count it on one rank only.
        if getattr(p, "tensor_model_parallel", False) or dist.get_rank(shard_group) == 0:
            parts[expert].append(p.grad.float().pow(2).sum())
    if device is None:
        return 0.0
    vals = torch.stack([torch.stack(parts[k]).sum() if parts[k] else torch.zeros((), device=device)
                        for k in (False, True)])
    dense_sq, expert_sq = vals[0:1].clone(), vals[1:2].clone()
    if dist.get_world_size(tp) > 1:
        dist.all_reduce(dense_sq, group=tp)
    if dist.get_world_size(etmp) > 1:
        dist.all_reduce(expert_sq, group=etmp)
    sq[False], sq[True] = float(dense_sq.item()), float(expert_sq.item())
    return math.sqrt(sq[False] + sq[True])


class MixedPrecisionAdamW:
    """AdamW on fp32 master copies; the model's (possibly bf16) weights are refreshed after each step."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float, weight_decay: float):
        self.params = params
        self.masters = [p if p.dtype == torch.float32 else p.detach().float().clone().requires_grad_() for p in params]
        # Norms and biases are not decayed (the usual LLM recipe).
        decay = [m for m, p in zip(self.masters, params) if p.dim() > 1]
        no_decay = [m for m, p in zip(self.masters, params) if p.dim() <= 1]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(0.9, 0.95), eps=1e-8)

    def step(self, lr: float, clip: float, grad_norm: float) -> None:
        scale = clip / (grad_norm + 1e-6) if clip > 0 and grad_norm > clip else 1.0
        for master, p in zip(self.masters, self.params):
            if p.grad is None:
                continue
            if master is not p:
                master.grad = p.grad.float()
            if scale != 1.0:
                master.grad.mul_(scale)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        with torch.no_grad():
            for master, p in zip(self.masters, self.params):
                if master is not p:
                    p.copy_(master)

    def zero_grad(self) -> None:
        for master, p in zip(self.masters, self.params):
            p.grad = None
            if master is not p:
                master.grad = None


def lr_at(step: int, steps: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to `min_lr` at the last step."""
    if warmup and step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, steps - 1 - warmup)
    frac = min(1.0, (step - warmup) / span)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * frac))
