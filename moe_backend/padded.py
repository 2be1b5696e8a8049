"""The padded (low-latency) layout: dispatch straight into per-(expert, source group) slots.

`Communicator.dispatch_padded` returns each local expert's rows in a `[L, G * M, hidden]` batch:
the rows from source group `g` sit at `g * M + i`, `i < counts[l, g]`, in source-row order. A
sender knows every slot from its own routing (a token's rank among its own tokens for that
expert), so a backend can store rows straight into place with no count exchange before them:
the decode layout masked grouped GEMMs take. `combine_padded` takes the expert outputs in the
same layout and returns the contract's combine (docs/CONTRACT.md, same summation order).

A backend with no padded path of its own gets it here, from its contiguous dispatch and
combine (`from_received` / `to_contiguous`): exact by construction, the layouts hold the same
rows. The reference backend always takes this path; docs/CONTRACT.md "The padded layout".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from .result import Handle, row_local_experts
from .spec import CommSpec


@dataclasses.dataclass
class PaddedHandle:
    """Routing metadata of one padded dispatch round; consumed by `combine_padded`.

    `src_token` / `src_k` (`[L, G * M]` int32): each slot's source row in its group and the
    position of the expert in that row's `topk_ids`; -1 past the slot's count (or unspecified
    for a backend's native path: read them below `counts` only).
    """

    comm_id: int
    round: int
    spec: CommSpec
    num_tokens: int | torch.Tensor
    num_input_rows: int
    counts: torch.Tensor
    src_token: torch.Tensor
    src_k: torch.Tensor
    topk_ids: torch.Tensor
    backend_state: Any = None


@dataclasses.dataclass
class PaddedDispatchResult:
    """`tokens [L, G * M, hidden]`, `scales [L, G * M, hidden / block]` (fp8), `weights [L, G * M]`
    (when `topk_weights` was given), `counts [L, G]` int32, `tokens_per_expert [L]` int64.

    Slots at or past `counts[l, g]` are unspecified. A backend's native path may return views of
    its receive buffers: they hold this round's rows until this rank's `combine_padded` returns.
    """

    tokens: torch.Tensor
    scales: torch.Tensor | None
    weights: torch.Tensor | None
    counts: torch.Tensor
    tokens_per_expert: torch.Tensor
    handle: PaddedHandle

    def valid_slots(self) -> torch.Tensor:
        """`[L, G * M]` bool: the slots that hold a row (no host sync)."""
        return slot_mask(self.counts, self.handle.spec.max_num_tokens)


@dataclasses.dataclass
class Padded:
    """A backend's padded dispatch, before the communicator wraps it (see PaddedDispatchResult)."""

    tokens: torch.Tensor
    scales: torch.Tensor | None
    weights: torch.Tensor | None
    counts: torch.Tensor
    tokens_per_expert: torch.Tensor
    src_token: torch.Tensor
    src_k: torch.Tensor
    backend_state: Any = None


@dataclasses.dataclass
class Derived:
    """The backend state of a padded dispatch derived from the contiguous one: that dispatch's
    handle (for its combine) and each contiguous row's slot (`L * G * M` for rows past the total)."""

    handle: Handle
    slot: torch.Tensor


def slot_mask(counts: torch.Tensor, max_num_tokens: int) -> torch.Tensor:
    """`[L, G * M]` bool: slot `g * M + i` of expert `l` holds a row when `i < counts[l, g]`."""
    L, G = counts.shape
    i = torch.arange(max_num_tokens, device=counts.device)
    return (i[None, None, :] < counts[:, :, None]).reshape(L, G * max_num_tokens)


def from_received(spec: CommSpec, tokens: torch.Tensor, scales: torch.Tensor | None, weights: torch.Tensor | None,
                  handle: Handle) -> Padded:
    """The padded layout of a contiguous dispatch result (rows by expert, then group, then row)."""
    L, G, M = spec.num_local_experts, spec.num_groups, spec.max_num_tokens
    device = tokens.device
    rows = tokens.shape[0]
    offsets = handle.expert_offsets
    r = torch.arange(rows, device=device)
    valid = r < offsets[-1]
    expert = row_local_experts(offsets, rows)
    group = torch.where(valid, handle.src_group.long(), 0)  # rows past the total hold poison
    pair = expert * G + group
    counts = torch.zeros(L * G, dtype=torch.int64, device=device).index_add_(0, pair, valid.long()).view(L, G)
    # A pair's first contiguous row: its expert's offset plus the counts of the groups before it.
    first = offsets[:-1, None] + counts.cumsum(1) - counts
    slot = torch.where(valid, pair * M + (r - first.view(-1)[pair]), L * G * M)

    def scatter(src: torch.Tensor | None, fill_byte: int) -> torch.Tensor | None:
        if src is None:
            return None
        # Through byte views: exact for every dtype (fp8 has no index_copy); 0xff fills int32 with -1.
        row = src.reshape(rows, math.prod(src.shape[1:])).view(torch.uint8)
        out = torch.full((L * G * M + 1, row.shape[1]), fill_byte, dtype=torch.uint8, device=device)
        out.index_copy_(0, slot, row)  # rows past the total all land in the spare last slot
        return out[:-1].view(src.dtype).view(L, G * M, *src.shape[1:])

    return Padded(
        tokens=scatter(tokens, 0),
        scales=scatter(scales, 0),
        weights=scatter(weights, 0),
        counts=counts.to(torch.int32),
        tokens_per_expert=counts.sum(1),
        src_token=scatter(handle.src_token, 0xFF),
        src_k=scatter(handle.src_k, 0xFF),
        backend_state=Derived(handle, slot),
    )


def to_contiguous(derived: Derived, expert_y: torch.Tensor, weights: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Padded expert outputs (and weights) back in the contiguous rows of `derived.handle`."""
    last = expert_y.shape[0] * expert_y.shape[1] - 1
    slot = derived.slot.clamp(max=last)  # rows past the total: any row (combine never reads them)
    y = expert_y.reshape(-1, expert_y.shape[-1]).index_select(0, slot)
    w = None if weights is None else weights.reshape(-1).index_select(0, slot)
    return y, w
