"""The interface every transport implements; the Communicator drives it.

The Communicator validates inputs, keeps the round state machine and builds the public
results; a backend only moves data. Inputs reaching a backend are already checked:
`topk_ids` int32 contiguous `[T, topk]`, `num_tokens` a host int or an int32 `[1]` device
tensor, every tensor on the communicator's device.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import torch
import torch.distributed as dist

from ..padded import Padded, PaddedHandle
from ..result import Handle
from ..spec import CommSpec


@dataclasses.dataclass
class Received:
    """What a backend's dispatch receive produces (see docs/CONTRACT.md for each field)."""

    tokens: torch.Tensor
    scales: torch.Tensor | None
    weights: torch.Tensor | None
    tokens_per_expert: torch.Tensor
    expert_offsets: torch.Tensor
    src_group: torch.Tensor
    src_token: torch.Tensor
    src_k: torch.Tensor
    backend_state: Any = None
    host_valid_rows: int | None = None  # set when the backend knows the total on the host


class Backend(abc.ABC):
    """One transport for one `CommSpec` on one process group."""

    name: str = "abstract"

    def __init__(self, spec: CommSpec, group: dist.ProcessGroup | None, device: torch.device):
        self.spec = spec
        self.group = group
        self.device = device
        self.rank = dist.get_rank(group)

    @abc.abstractmethod
    def dispatch_send(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor | None,
        x_scale: torch.Tensor | None,
        num_tokens: int | torch.Tensor,
    ) -> Any:
        """Start sending; never blocks on peers. Returns state for `dispatch_recv`."""

    def dispatch_whole(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor | None,
        x_scale: torch.Tensor | None,
        num_tokens: int | torch.Tensor,
    ) -> Any:
        """A dispatch with nothing between send and receive (`Communicator.dispatch`): a
        backend may do it in fewer steps. Returns state for `dispatch_recv`."""
        return self.dispatch_send(x, topk_ids, topk_weights, x_scale, num_tokens)

    @abc.abstractmethod
    def dispatch_recv(self, pending: Any) -> Received:
        """Wait for this round's tokens and lay them out per local expert."""

    @abc.abstractmethod
    def combine_send(
        self, expert_y: torch.Tensor, handle: Handle, weights: torch.Tensor | None, out: torch.Tensor
    ) -> Any:
        """Reduce per source token on this rank and start sending the partials.

        `out` is the tensor `combine_recv` will be given: a backend may start the receive
        now, concurrently, writing it (the nvshmem backend does); it is valid only after
        `combine_recv`.
        """

    @abc.abstractmethod
    def combine_recv(self, pending: Any, out: torch.Tensor) -> torch.Tensor:
        """Wait for the partials of this rank's tokens and sum them into `out`."""

    def combine_whole(
        self, expert_y: torch.Tensor, handle: Handle, weights: torch.Tensor | None, out: torch.Tensor
    ) -> torch.Tensor:
        """A combine with nothing between send and receive (`Communicator.combine`): a backend
        may do it in fewer steps. Returns `out`, summed."""
        return self.combine_recv(self.combine_send(expert_y, handle, weights, out), out)

    def dispatch_padded(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor | None,
        x_scale: torch.Tensor | None,
        num_tokens: int | torch.Tensor,
    ) -> Padded | None:
        """A whole dispatch into the padded layout by the backend's own path, or None where it has
        none for these inputs (the communicator then derives it from the contiguous dispatch): a
        backend may do it in fewer steps than its send and receive."""
        pending = self.dispatch_padded_send(x, topk_ids, topk_weights, x_scale, num_tokens)
        return None if pending is None else self.dispatch_padded_recv(pending)

    def dispatch_padded_send(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor | None,
        x_scale: torch.Tensor | None,
        num_tokens: int | torch.Tensor,
    ) -> Any:
        """Start a padded dispatch by the backend's own path (state for `dispatch_padded_recv`), or
        None where it has none (the communicator derives it from the contiguous split phases)."""
        return None

    def dispatch_padded_recv(self, pending: Any) -> Padded:
        """Complete the padded dispatch `dispatch_padded_send` started."""
        raise NotImplementedError(f"the {self.name} backend has no padded dispatch of its own")

    def combine_padded(
        self, expert_y: torch.Tensor, handle: PaddedHandle, weights: torch.Tensor | None, out: torch.Tensor
    ) -> torch.Tensor:
        """The combine of a padded dispatch that `dispatch_padded` returned (not None)."""
        raise NotImplementedError(f"the {self.name} backend has no padded combine of its own")

    def close(self) -> None:
        """Release buffers; collective for backends with symmetric memory."""
