"""A Megatron-core token dispatcher over moe_backend's differentiable dispatch/combine.

Megatron's six steps map onto one communicator round (see docs/MEGATRON_INTEGRATION.md):

- `dispatch_preprocess`: routing_map/probs -> topk ids/weights (device only, no sync).
- `token_dispatch`: dispatch send, shared-expert fc1 (overlap), dispatch receive.
- `dispatch_postprocess`: tokens per local expert (already contiguous by the contract),
  `tokens_per_expert` on host (one sync, taken by the dispatch receive, which then keeps
  only the valid rows) or device, padding for drop-and-pad/alignment.
- `combine_preprocess`: undo the padding (local gathers); host counts: nothing to undo.
- `token_combine`: unweighted combine send, shared-expert fc2 (overlap), receive.
- `combine_postprocess`: the input's shape, plus the shared-expert output.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from megatron.core.transformer.moe.moe_utils import (
    get_align_size_for_quantization,
    get_capacity,
    get_default_pg_collection,
)
from megatron.core.transformer.moe.token_dispatcher import MoETokenDispatcher

from moe_backend.autograd import DifferentiableCommunicator, Dispatched
from moe_backend.backends import BACKENDS, TRAINING_WAIT_S, resolve_backend
from moe_backend.spec import CommSpec

from .cache import get_communicator
from .groups import GroupMapping, build_mapping
from .routing import PaddedLayout, routing_to_topk, to_virtual


@dataclasses.dataclass(frozen=True)
class DispatcherOptions:
    """How the dispatcher drives moe_backend (not saved in checkpoints)."""

    backend: str = "auto"  # "auto" | "reference" | "nvshmem"
    max_num_tokens: int | None = None  # None: the group's largest first batch (one all_reduce)
    host_tokens_per_expert: bool = True  # False: stay on device (fused grouped GEMM, CUDA graphs)
    pad_multiple: int | None = None  # None: Megatron's fp8/fp4 alignment if router padding is on
    combine_in_float32: bool = False
    # Value checks of topk_ids cost host syncs on every dispatch; the router's ids are
    # well-formed by construction, so they are off unless asked for (debugging a router).
    check_inputs: bool = False
    backend_options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        """Refuse bad values here, at construction, not at the first forward step."""
        if self.backend not in BACKENDS:
            raise ValueError(f"DispatcherOptions.backend must be one of {BACKENDS}, got {self.backend!r}")
        for name in ("max_num_tokens", "pad_multiple"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"DispatcherOptions.{name} must be None or an integer >= 1, got {value!r}")
        for name in ("host_tokens_per_expert", "combine_in_float32", "check_inputs"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"DispatcherOptions.{name} must be True or False, got {getattr(self, name)!r}")
        for item in self.backend_options:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
                raise TypeError(f"DispatcherOptions.backend_options must be (name, value) pairs, got {item!r}")
            try:
                hash(item[1])  # the communicator cache keys on them
            except TypeError:
                raise TypeError(f"DispatcherOptions.backend_options {item[0]!r}: the value must be hashable "
                                f"(a tuple, not a list), got {item[1]!r}") from None


def communicator_options(options: DispatcherOptions, device: torch.device) -> dict[str, Any]:
    """The communicator's options: the input checks, the backend's own options, and where the
    nvshmem backend runs, training's wait for a late peer (TRAINING_WAIT_S) unless they set one."""
    out = {"check_inputs": options.check_inputs, **dict(options.backend_options)}
    if resolve_backend(options.backend, device) == "nvshmem":
        out.setdefault("timeout_s", TRAINING_WAIT_S)
    return out


class MoEBackendTokenDispatcher(MoETokenDispatcher):
    """Megatron `MoETokenDispatcher` whose communication is moe_backend's dispatch/combine."""

    def __init__(
        self,
        num_local_experts: int,
        local_expert_indices: list[int],
        config,
        pg_collection=None,
        options: DispatcherOptions | None = None,
    ) -> None:
        pg_collection = pg_collection if pg_collection is not None else get_default_pg_collection()
        super().__init__(config=config, pg_collection=pg_collection)
        self.options = options or DispatcherOptions()
        self.num_local_experts = num_local_experts
        self.local_expert_indices = list(local_expert_indices)
        self.num_experts = config.num_moe_experts
        self.topk = config.moe_router_topk
        self.mapping: GroupMapping = build_mapping(pg_collection, self.num_experts, config.sequence_parallel)
        if self.mapping.num_local_experts != num_local_experts:
            raise ValueError(
                f"num_local_experts={num_local_experts} but the EP group implies {self.mapping.num_local_experts}"
            )
        # The communicator places global expert e on EP rank e // L: the layer's experts must be those.
        first = dist.get_rank(pg_collection.ep) * num_local_experts
        if self.local_expert_indices != list(range(first, first + num_local_experts)):
            raise ValueError(f"local_expert_indices={self.local_expert_indices}: this EP rank holds experts "
                             f"[{first}, {first + num_local_experts}) (expert e on EP rank e // num_local_experts)")
        self.drop_and_pad = bool(config.moe_pad_expert_input_to_capacity)
        if self.drop_and_pad and config.moe_expert_capacity_factor is None:
            raise ValueError("moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor")
        self.pad_multiple = self.options.pad_multiple
        if self.pad_multiple is None and config.moe_router_padding_for_quantization:
            self.pad_multiple = get_align_size_for_quantization(config) or None
        self._max_tokens = self.options.max_num_tokens
        self._virtual: torch.Tensor | None = None
        self._ex: DifferentiableCommunicator | None = None
        # (device, communicator_options) of the last call: computed again only on another device.
        self._comm_options: tuple[torch.device, dict[str, Any]] | None = None
        self._dispatched: Dispatched | None = None
        self._layout: PaddedLayout | None = None
        # Host counts (drop-and-pad needs none: its sizes are fixed): the dispatch receive syncs.
        self._host_trim = self.options.host_tokens_per_expert and not self.drop_and_pad
        # Tensors set by dispatch_preprocess: what a CUDA graph of the preprocess step returns.
        self.cudagraph_attrs = ["_topk_ids"]

    # -- helpers --------------------------------------------------------------------------
    def _communicator(self, x: torch.Tensor) -> DifferentiableCommunicator:
        rows = x.shape[0]
        if self._max_tokens is None:
            # Agree on one bound over the group (first call only): creation is collective.
            bound = torch.tensor([rows], dtype=torch.int64, device=x.device)
            if self.mapping.world_size > 1:
                dist.all_reduce(bound, op=dist.ReduceOp.MAX, group=self.mapping.group)
            self._max_tokens = int(bound.item())
        if rows > self._max_tokens:
            raise ValueError(
                f"{rows} tokens exceed max_num_tokens={self._max_tokens}; set DispatcherOptions.max_num_tokens"
            )
        m = self.mapping
        spec = CommSpec(
            num_experts=m.num_virtual_experts,
            topk=self.topk * m.etp,
            hidden=x.shape[-1],
            max_num_tokens=self._max_tokens,
            world_size=m.world_size,
            tp_size=m.replicas,
            in_dtype=x.dtype,
            out_dtype=x.dtype,
            combine_in_float32=self.options.combine_in_float32,
        )
        if self._comm_options is None or self._comm_options[0] != x.device:  # resolving `auto` queries the device
            self._comm_options = (x.device, communicator_options(self.options, x.device))
        return get_communicator(spec, m.group, self.options.backend, x.device, self._comm_options[1])

    def _virtual_table(self, device: torch.device) -> torch.Tensor:
        if self._virtual is None or self._virtual.device != device:
            self._virtual = self.mapping.virtual_table(device)
        return self._virtual

    def set_shared_experts(self, shared_experts) -> None:
        super().set_shared_experts(shared_experts)
        if shared_experts.use_shared_expert_gate:
            self.cudagraph_attrs.append("shared_experts.gate_score")
        self.cudagraph_attrs.append("shared_experts.cached_fc1_input")

    # -- the six steps ------------------------------------------------------------------
    def dispatch_preprocess(self, tokens: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor):
        self.hidden_shape = tokens.shape
        x = tokens.reshape(-1, tokens.shape[-1])
        want = (x.shape[0], self.num_experts)  # shapes only: no host sync
        if tuple(routing_map.shape) != want or tuple(probs.shape) != want:
            raise ValueError(f"routing_map {tuple(routing_map.shape)} and probs {tuple(probs.shape)} must both be "
                             f"[tokens, num_moe_experts] = {list(want)}")
        self._ex = self._communicator(x)
        self._probs_dtype = probs.dtype
        self._num_input_tokens = x.shape[0]
        ids, weights = routing_to_topk(routing_map, probs, self.topk)
        self._topk_ids, weights = to_virtual(ids, weights, self._virtual_table(x.device))
        if self.shared_experts is not None:
            self.shared_experts.pre_forward_comm(tokens)
        return x, weights

    def token_dispatch(self, hidden_states: torch.Tensor, probs: torch.Tensor):
        if self.shared_experts is not None:
            self.shared_experts.wait_current_stream()
        pending = self._ex.dispatch_send(hidden_states.contiguous(), self._topk_ids, probs)
        if self.shared_experts is not None:  # overlaps the transfer
            self.shared_experts.linear_fc1_forward_and_act()
        # Host counts: the receive syncs once and keeps only the valid rows, so neither the
        # experts, the combine nor the backward touch the static rows past them.
        self._dispatched = pending.recv(valid_only=self._host_trim)
        return self._dispatched.tokens, self._dispatched.weights

    def dispatch_postprocess(self, hidden_states: torch.Tensor, probs: torch.Tensor):
        d = self._dispatched
        probs = probs.to(self._probs_dtype)
        host = self.options.host_tokens_per_expert
        L = self.num_local_experts
        if self.drop_and_pad or self.pad_multiple:
            sizes, rows, tokens_per_expert = self._padded_sizes(d, hidden_states.shape[0])
            self._layout = PaddedLayout(d.tokens_per_expert, d.expert_offsets, sizes, rows, hidden_states.shape[0])
            return self._layout.pad(hidden_states), tokens_per_expert, self._layout.pad(probs)
        self._layout = None
        if not host:
            return hidden_states, d.tokens_per_expert, probs
        counts = d.host_tokens_per_expert  # read by the dispatch receive (the one host sync)
        assert counts is not None and counts.numel() == L
        total = d.handle.host_valid_rows
        # Already trimmed (no slice here: its backward would zero-fill the untrimmed rows).
        assert hidden_states.shape[0] == total and probs.shape[0] == total, (hidden_states.shape, total)
        return hidden_states, counts, probs

    def _padded_sizes(self, d: Dispatched, rows_in: int) -> tuple[torch.Tensor, int, torch.Tensor]:
        L, device = self.num_local_experts, d.tokens_per_expert.device
        if self.drop_and_pad:
            # Megatron's per-source capacity, times the sources (DP groups) that send here.
            per_source = get_capacity(
                num_tokens=self._num_input_tokens * self.topk,
                num_experts=self.num_experts,
                capacity_factor=self.config.moe_expert_capacity_factor,
            )
            cap = per_source * (self.mapping.world_size // self.mapping.replicas)
            sizes = torch.full((L,), cap, dtype=torch.int64, device=device)
            host = torch.full((L,), cap, dtype=torch.int64)  # known on host: no sync
            return sizes, L * cap, host if self.options.host_tokens_per_expert else sizes
        a = self.pad_multiple
        sizes = (d.tokens_per_expert + a - 1) // a * a
        if self.options.host_tokens_per_expert:
            host = (d.host_tokens_per_expert + a - 1) // a * a  # counts read by the receive: no sync
            return sizes, int(host.sum()), host
        return sizes, rows_in + L * (a - 1), sizes  # static bound: rows past the sizes are zero

    def combine_preprocess(self, hidden_states: torch.Tensor) -> torch.Tensor:
        spec = self._ex.comm.spec
        y = hidden_states.to(spec.out_dtype)
        if self._layout is not None:
            y = self._layout.unpad(y)
            self._layout = None
        # Host counts: y has the valid rows only, and the handle knows that count
        # (`host_valid_rows`), so combine takes them as they are: no pad to the static rows.
        return y

    def token_combine(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.shared_experts is not None:
            self.shared_experts.wait_current_stream()
        pending = self._ex.combine_send(hidden_states.contiguous(), self._dispatched)
        if self.shared_experts is not None:  # overlaps the transfer
            self.shared_experts.linear_fc2_forward()
            self.shared_experts.post_forward_comm()
        out = pending.recv()
        self._dispatched = None
        return out

    def combine_postprocess(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = hidden_states.view(self.hidden_shape)
        if self.shared_experts is not None:
            out = out + self.shared_experts.get_output()
        return out
