"""Reference backend: `torch.distributed.all_to_all_single`, on gloo (CPU) or NCCL (GPU).

The semantic oracle of docs/CONTRACT.md and the "standard all-to-all" baseline. It sends
one packed row per (token, expert) pair, lets the receiver sort them into the contract's
layout, and reduces combine partials in exactly the contract's order. Clarity over speed:
it synchronises with the host (split sizes) like any dense all-to-all must.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist

from ..result import Handle
from .base import Backend, Received

_META = 4  # int64 fields per dispatched row: group, token, local expert, k


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """View a tensor's rows as raw bytes, so every dtype travels through gloo."""
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], math.prod(t.shape[1:]) * t.element_size())


def _from_bytes(b: torch.Tensor, dtype: torch.dtype, cols: int) -> torch.Tensor:
    # A fresh flat copy: column slices of the packed rows are neither contiguous nor aligned.
    return b.reshape(-1).clone().view(dtype).reshape(b.shape[0], cols)


def _pad_with_poison(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` extended to `rows` rows of 0xFF bytes (NaN for floats, -1 for ints)."""
    out = torch.empty((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
    out.view(torch.uint8).fill_(0xFF)
    out[: t.shape[0]] = t
    return out


def token_rank_mask(topk_ids: torch.Tensor, num_local: int, world: int) -> torch.Tensor:
    """`[T, world]` bool: token t has at least one (undropped) expert on rank r."""
    valid = topk_ids >= 0
    dest = torch.where(valid, topk_ids.long() // num_local, torch.full_like(topk_ids, world, dtype=torch.long))
    mask = torch.zeros(topk_ids.shape[0], world + 1, dtype=torch.bool, device=topk_ids.device)
    mask.scatter_(1, dest, True)
    return mask[:, :world]


@dataclasses.dataclass
class _PendingCombine:
    recv: torch.Tensor
    recv_counts: list[int]
    num_tokens: int


class ReferenceBackend(Backend):
    """`static_shapes=True` returns the GPU backends' static row count
    (`spec.max_recv_tokens`), with poison past the valid rows, and like them leaves
    `Handle.host_valid_rows` unset: it lets the CPU suite cover every caller's handling of
    static shapes (CUDA graphs, the nvshmem backend)."""

    name = "reference"

    def __init__(self, spec, group, device, static_shapes: bool = False):
        super().__init__(spec, group, device)
        self.static_shapes = static_shapes

    def _host_num_tokens(self, num_tokens: int | torch.Tensor, rows: int) -> int:
        # Clamped as the kernels clamp: an unchecked device count (check_inputs=False) may be anything.
        n = int(num_tokens.item()) if isinstance(num_tokens, torch.Tensor) else num_tokens
        return max(0, min(n, rows))

    def _exchange(self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
        recv = torch.empty(sum(recv_counts), send.shape[1], dtype=send.dtype, device=send.device)
        dist.all_to_all_single(recv, send, recv_counts, send_counts, group=self.group)
        return recv

    def _exchange_counts(self, send_counts: torch.Tensor) -> list[int]:
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        return recv_counts.tolist()

    def dispatch_send(self, x, topk_ids, topk_weights, x_scale, num_tokens):
        spec = self.spec
        n = self._host_num_tokens(num_tokens, x.shape[0])
        group, replica = divmod(self.rank, spec.tp_size)
        ids = topk_ids[:n].long()
        token = torch.arange(n, device=ids.device)[:, None].expand_as(ids)
        kpos = torch.arange(spec.topk, device=ids.device)[None, :].expand_as(ids)
        # Replica j of a group sends the tokens t with t % tp_size == j.
        send = (ids >= 0) & (token % spec.tp_size == replica)
        ids, token, kpos = ids[send], token[send], kpos[send]
        dest = ids // spec.num_local_experts
        order = torch.argsort(dest, stable=True)
        ids, token, kpos, dest = ids[order], token[order], kpos[order], dest[order]

        meta = torch.stack(
            [torch.full_like(token, group), token, ids % spec.num_local_experts, kpos], dim=1
        )
        parts = [_as_bytes(meta), _as_bytes(x)[token]]
        if topk_weights is not None:
            parts.append(_as_bytes(topk_weights[token, kpos][:, None]))
        if x_scale is not None:
            parts.append(_as_bytes(x_scale)[token])
        packed = torch.cat(parts, dim=1)

        send_counts = torch.bincount(dest, minlength=spec.world_size)
        recv_counts = self._exchange_counts(send_counts)
        recv = self._exchange(packed, send_counts.tolist(), recv_counts)
        return recv, topk_weights is not None

    def dispatch_recv(self, pending) -> Received:
        spec = self.spec
        recv, weighted = pending
        cols = [_META * 8, spec.hidden * spec.in_dtype.itemsize]
        if weighted:
            cols.append(4)
        if spec.num_scales:
            cols.append(spec.num_scales * 4)
        fields = list(torch.split(recv, cols, dim=1))
        meta = _from_bytes(fields.pop(0), torch.int64, _META)
        group, token, expert, kpos = meta.unbind(1)
        # The contract's layout: by local expert, then source group, then source row.
        key = (expert * spec.num_groups + group) * spec.max_num_tokens + token
        order = torch.argsort(key, stable=True)
        tokens = _from_bytes(fields.pop(0)[order], spec.in_dtype, spec.hidden)
        weights = _from_bytes(fields.pop(0)[order], torch.float32, 1)[:, 0] if weighted else None
        scales = _from_bytes(fields.pop(0)[order], torch.float32, spec.num_scales) if spec.num_scales else None
        counts = torch.bincount(expert, minlength=spec.num_local_experts)
        offsets = torch.zeros(spec.num_local_experts + 1, dtype=torch.int64, device=recv.device)
        torch.cumsum(counts, 0, out=offsets[1:])
        # The all-to-all's split sizes are on the host: the total is known without a sync.
        # Static shapes leave it unset, as the GPU backends do, so the CPU suite covers that path.
        total = None if self.static_shapes else tokens.shape[0]
        rows = [tokens, scales, weights, group[order].int(), token[order].int(), kpos[order].int()]
        if self.static_shapes:
            rows = [None if t is None else _pad_with_poison(t, spec.max_recv_tokens) for t in rows]
        tokens, scales, weights, src_group, src_token, src_k = rows
        return Received(
            tokens=tokens,
            scales=scales,
            weights=weights,
            tokens_per_expert=counts,
            expert_offsets=offsets,
            src_group=src_group,
            src_token=src_token,
            src_k=src_k,
            host_valid_rows=total,
        )

    def combine_send(self, expert_y, handle: Handle, weights, out):
        spec = self.spec
        total = handle.num_valid_rows()
        y = expert_y[:total]
        group = handle.src_group[:total].long()
        token = handle.src_token[:total].long()
        kpos = handle.src_k[:total].long()
        # One partial per source token held here, summed in k order (the contract's step 1).
        source, inverse = torch.unique(group * spec.max_num_tokens + token, return_inverse=True)
        slot = torch.full((source.numel(), spec.topk), -1, dtype=torch.long, device=y.device)
        slot[inverse, kpos] = torch.arange(total, device=y.device)
        acc = torch.zeros(source.numel(), spec.hidden, dtype=torch.float32, device=y.device)
        for k in range(spec.topk):
            has = slot[:, k] >= 0
            rows = slot[has, k]
            contrib = y[rows].float()
            if weights is not None:
                contrib = contrib * weights[rows].float()[:, None]
            acc[has] = acc[has] + contrib
        partial = acc.to(spec.transfer_dtype)

        # Every replica of the source group receives the partial.
        src_group, src_token = source // spec.max_num_tokens, source % spec.max_num_tokens
        replicas = torch.arange(spec.tp_size, device=y.device)
        dest = (src_group[:, None] * spec.tp_size + replicas[None, :]).reshape(-1)
        rows = torch.arange(source.numel(), device=y.device).repeat_interleave(spec.tp_size)
        order = torch.argsort(dest, stable=True)
        dest, rows = dest[order], rows[order]
        packed = torch.cat([_as_bytes(src_token[rows][:, None]), _as_bytes(partial[rows])], dim=1)
        send_counts = torch.bincount(dest, minlength=spec.world_size).tolist()

        # What this rank will receive is known from its own routing: no count exchange.
        n = self._host_num_tokens(handle.num_tokens, handle.num_input_rows)
        expect = token_rank_mask(handle.topk_ids[:n], spec.num_local_experts, spec.world_size)
        recv_counts = expect.sum(0).tolist()
        recv = self._exchange(packed, send_counts, recv_counts)
        return _PendingCombine(recv, recv_counts, n)

    def combine_recv(self, pending: _PendingCombine, out: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        token_bytes, partial_bytes = torch.split(pending.recv, [8, spec.hidden * spec.transfer_dtype.itemsize], 1)
        token = _from_bytes(token_bytes, torch.int64, 1)[:, 0]
        partial = _from_bytes(partial_bytes, spec.transfer_dtype, spec.hidden)
        acc = torch.zeros(out.shape[0], spec.hidden, dtype=torch.float32, device=out.device)
        start = 0
        for count in pending.recv_counts:  # rank order: the contract's step 3
            rows = slice(start, start + count)
            acc[token[rows]] = acc[token[rows]] + partial[rows].float()
            start += count
        out.copy_(acc)
        return out
