"""Megatron routing -> the communicator's `topk_ids`/`topk_weights`, and per-expert padding.

Everything here runs on the device without host syncs.
"""

from __future__ import annotations

import torch

from moe_backend.result import row_local_experts


def routing_to_topk(
    routing_map: torch.Tensor, probs: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`routing_map [T, E]` bool and `probs [T, E]` -> `topk_ids [T, topk]` int32 and float32 weights.

    Rows with fewer than `topk` routed experts (capacity drops) get `-1` ids and weight 0.
    Rows with more (drop-and-pad marks zero-probability padding pairs) keep the `topk`
    most probable pairs; the padding itself is rebuilt after dispatch (see `PaddedLayout`).
    The weights are gathered from `probs`, so gradients flow back to the router.
    """
    scores = torch.where(routing_map, probs.detach().float(), float("-inf"))
    best, idx = scores.topk(topk, dim=1)
    valid = best > float("-inf")
    ids = torch.where(valid, idx, -1).to(torch.int32)
    weights = torch.where(valid, probs.gather(1, idx).float(), 0.0)
    return ids, weights


def to_virtual(
    ids: torch.Tensor, weights: torch.Tensor, virtual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace each expert by its `etp` shard copies (`virtual [E, etp]` -> comm expert ids).

    Expert tensor parallelism: every shard of an expert needs the token, and combine then
    sums the shards' partial outputs (what Megatron's reduce-scatter does).
    """
    etp = virtual.shape[1]
    if etp == 1:
        return torch.where(ids >= 0, virtual[ids.long().clamp(min=0), 0].to(ids.dtype), -1), weights
    valid = (ids >= 0)[:, :, None]
    vids = torch.where(valid, virtual[ids.long().clamp(min=0)], -1).to(torch.int32)
    rows = ids.shape[0]
    return vids.reshape(rows, -1), weights[:, :, None].expand(-1, -1, etp).reshape(rows, -1)


class PaddedLayout:
    """Per-expert segments padded to fixed or aligned sizes (drop-and-pad, fp8 alignment).

    Segment `e` holds the `count[e]` received rows of local expert `e`, then zero rows up to
    `size[e]`. Built from device counts: gathers only, differentiable both ways.
    """

    def __init__(self, counts: torch.Tensor, offsets: torch.Tensor, sizes: torch.Tensor, rows: int, src_rows: int):
        device = counts.device
        self.sizes = sizes
        padded_offsets = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)])
        starts = padded_offsets[:-1]
        # Padded row p -> (expert, slot) -> received row.
        p = torch.arange(rows, device=device)
        expert = row_local_experts(padded_offsets, rows)
        slot = p - starts[expert]
        self.pad_valid = (slot < counts[expert]) & (slot < sizes[expert])
        self.pad_src = (offsets[expert] + slot).clamp(0, max(src_rows - 1, 0))
        # Received row r -> padded row (rows past the total, or over a fixed size, are dropped).
        r = torch.arange(src_rows, device=device)
        r_expert = row_local_experts(offsets, src_rows)
        r_slot = r - offsets[r_expert]
        self.row_valid = (r < offsets[-1]) & (r_slot < sizes[r_expert])
        self.row_dst = (starts[r_expert] + r_slot).clamp(0, max(rows - 1, 0))

    def pad(self, rows: torch.Tensor) -> torch.Tensor:
        return _masked_gather(rows, self.pad_src, self.pad_valid)

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        return _masked_gather(padded, self.row_dst, self.row_valid)


def _masked_gather(src: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """`src[index]` where `valid`, zero rows elsewhere (differentiable; zeros for an empty src)."""
    if src.shape[0] == 0:
        return src.new_zeros((index.shape[0], *src.shape[1:]))
    got = src.index_select(0, index)
    mask = valid.view(-1, *([1] * (src.dim() - 1)))
    return torch.where(mask, got, torch.zeros((), dtype=src.dtype, device=src.device))
