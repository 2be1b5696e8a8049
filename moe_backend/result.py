"""What dispatch returns: the received tokens and the handle combine needs."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .spec import CommSpec


@dataclasses.dataclass
class Handle:
    """Routing metadata of one dispatch round; consumed by combine and by backward.

    `src_group`, `src_token`, `src_k` describe each received row (see docs/CONTRACT.md).
    `backend_state` holds whatever the backend needs beyond that; it is opaque.
    `host_valid_rows`: the valid row count (`expert_offsets[-1]`) when it is known on the
    host without a sync (reference backend, `DispatchResult.valid()`, a caller that synced);
    combine then needs only that many rows of `expert_y` / `weights`.
    """

    comm_id: int
    round: int
    spec: CommSpec
    num_tokens: int | torch.Tensor
    num_input_rows: int
    tokens_per_expert: torch.Tensor
    expert_offsets: torch.Tensor
    src_group: torch.Tensor
    src_token: torch.Tensor
    src_k: torch.Tensor
    topk_ids: torch.Tensor
    backend_state: Any = None
    host_valid_rows: int | None = None

    def num_valid_rows(self) -> int:
        """Rows of the dispatch result that hold data (a host sync unless `host_valid_rows` is set)."""
        if self.host_valid_rows is not None:
            return self.host_valid_rows
        return int(self.expert_offsets[-1].item())

    def set_host_valid_rows(self, n: int) -> None:
        """Record the valid row count the caller read from the device (it must be exact)."""
        rows = self.src_group.shape[0]
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= rows:
            raise ValueError(f"host_valid_rows must be an int in [0, {rows}] (the dispatch result's rows), got {n!r}")
        if self.host_valid_rows is not None and self.host_valid_rows != n:
            raise ValueError(f"host_valid_rows is already {self.host_valid_rows}, got {n}")
        self.host_valid_rows = n


@dataclasses.dataclass
class DispatchResult:
    tokens: torch.Tensor
    scales: torch.Tensor | None
    weights: torch.Tensor | None
    tokens_per_expert: torch.Tensor
    expert_offsets: torch.Tensor
    handle: Handle

    def valid(self) -> DispatchResult:
        """The same result trimmed to the rows that hold data (one host sync, none if known).

        Records the count on the handle, so combine accepts `expert_y` of just these rows.
        """
        return self.trimmed(self.handle.num_valid_rows())

    def trimmed(self, n: int) -> DispatchResult:
        """The first `n` rows, `n` = the valid row count read on the host (recorded on the handle)."""
        self.handle.set_host_valid_rows(n)
        return dataclasses.replace(
            self,
            tokens=self.tokens[:n],
            scales=None if self.scales is None else self.scales[:n],
            weights=None if self.weights is None else self.weights[:n],
        )

    def local_experts(self) -> torch.Tensor:
        """Each row's local expert (int64, `[rows]`), from the device offsets without a host sync.

        Rows past the valid total get the last expert (combine never reads them).
        """
        return row_local_experts(self.expert_offsets, self.tokens.shape[0])

    def padded(self, capacity: int | None = None) -> torch.Tensor:
        """`[L, capacity, hidden]` per-expert batches for batched GEMMs, zero past each count.

        Built on the device without a host sync: row `i` of expert `e` is flat row
        `expert_offsets[e] + i` when `i < tokens_per_expert[e]`. The default capacity holds
        every row an expert can receive; a smaller one keeps each expert's first `capacity`
        rows and drops the rest (a capacity drop: nothing checks, that would need a sync).
        """
        spec = self.handle.spec
        cap = spec.expert_capacity if capacity is None else capacity
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"capacity must be None or an int >= 1, got {cap!r}")
        num_local = spec.num_local_experts
        device = self.tokens.device
        slot = torch.arange(cap, device=device)
        rows = self.expert_offsets[:-1, None] + slot[None, :]
        valid = slot[None, :] < self.tokens_per_expert[:, None]
        rows = torch.where(valid, rows, torch.zeros_like(rows)).clamp_(max=max(self.tokens.shape[0] - 1, 0))
        out = torch.zeros(num_local, cap, spec.hidden, dtype=self.tokens.dtype, device=device)
        if self.tokens.shape[0] == 0:
            return out
        gathered = self.tokens.index_select(0, rows.reshape(-1)).view(num_local, cap, spec.hidden)
        # fp8 has no where(); select through a byte view, which is exact for every dtype.
        mask = valid[:, :, None].expand_as(gathered)
        out_bytes = out.view(torch.uint8) if out.element_size() == 1 else out
        src_bytes = gathered.view(torch.uint8) if gathered.element_size() == 1 else gathered
        out_bytes[mask] = src_bytes[mask]
        return out


def row_local_experts(expert_offsets: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Row `r`'s local expert `e` (`expert_offsets[e] <= r < expert_offsets[e + 1]`) for the
    first `num_rows` rows, clamped to the last expert past the total. It searches the whole
    offsets, not `expert_offsets[1:]`: inductor on CUDA (torch 2.11) ignores a sliced sequence's
    start in `searchsorted` and silently shifts the answer (pytorch/pytorch#182343)."""
    rows = torch.arange(num_rows, device=expert_offsets.device)
    last = expert_offsets.shape[0] - 2
    return (torch.searchsorted(expert_offsets, rows, right=True) - 1).clamp(0, max(last, 0))
