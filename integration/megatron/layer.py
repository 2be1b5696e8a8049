"""Plugging the dispatcher into Megatron without forking it.

- `MoEBackendLayer`: a `MoELayer` whose `token_dispatcher` is ours; ship it through a layer
  spec (`use_backend_dispatcher(spec)`, or `integration.megatron.spec` for
  `pretrain_gpt.py --spec integration.megatron.spec gpt_layer_spec`).
- `swap_token_dispatchers(model)`: replace the dispatcher of every `MoELayer` of a built model.
- `select_dispatcher(name, config)`: one name for ours and Megatron's own dispatchers.

Checkpoints stay portable: the dispatcher has no parameters or buffers and the saved
`moe_token_dispatcher_type` keeps one of Megatron's own values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import torch
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.moe_utils import get_default_pg_collection

from .dispatcher import DispatcherOptions, MoEBackendTokenDispatcher

OUR_DISPATCHERS = ("nvshmem", "reference")
MEGATRON_DISPATCHERS = ("alltoall", "allgather", "flex")
DISPATCHERS = OUR_DISPATCHERS + MEGATRON_DISPATCHERS


@contextlib.contextmanager
def _build_with_dispatcher_type(config, kind: str) -> Iterator[None]:
    # MoELayer.__init__ builds a stock dispatcher from this field; build the cheapest one
    # (allgather needs no CUDA stream) and restore the saved value right after.
    saved = config.moe_token_dispatcher_type
    config.moe_token_dispatcher_type = kind
    try:
        yield
    finally:
        config.moe_token_dispatcher_type = saved


class MoEBackendLayer(MoELayer):
    """`MoELayer` with moe_backend's token dispatcher (same parameters and state dict)."""

    def __init__(self, config, submodules=None, layer_number=None, pg_collection=None, is_mtp_layer=False,
                 name=None, options: DispatcherOptions | None = None):
        pg_collection = pg_collection if pg_collection is not None else get_default_pg_collection()
        with _build_with_dispatcher_type(config, "allgather"):
            super().__init__(config, submodules=submodules, layer_number=layer_number,
                             pg_collection=pg_collection, is_mtp_layer=is_mtp_layer, name=name)
        _install(self, pg_collection, options)


def _install(layer: MoELayer, pg_collection, options: DispatcherOptions | None) -> MoEBackendTokenDispatcher:
    dispatcher = MoEBackendTokenDispatcher(
        layer.num_local_experts, layer.local_expert_indices, layer.config, pg_collection, options
    )
    if layer.use_shared_expert and layer.shared_expert_overlap:
        dispatcher.set_shared_experts(layer.shared_experts)
    layer.token_dispatcher = dispatcher
    if hasattr(layer, "_training_token_dispatcher"):  # inference-optimized layers switch per forward
        layer._training_token_dispatcher = dispatcher
    return dispatcher


def _groups_of(layer: MoELayer) -> ProcessGroupCollection:
    """The groups a built layer's dispatcher was made with (layers do not keep pg_collection)."""
    old = layer.token_dispatcher
    pg = ProcessGroupCollection()
    pg.ep, pg.expt_tp, pg.tp_ep, pg.tp = old.ep_group, old.tp_group, old.tp_ep_group, layer.attn_tp_group
    return pg


def swap_token_dispatchers(model: torch.nn.Module, options: DispatcherOptions | None = None) -> int:
    """Give every `MoELayer` in `model` our dispatcher; returns how many were swapped.

    Collective: all ranks of each layer's TP x EP group must call it on the same model.
    """
    count = 0
    for module in model.modules():
        if isinstance(module, MoELayer):
            current = module.token_dispatcher
            if not isinstance(current, MoEBackendTokenDispatcher):
                _install(module, _groups_of(module), options)
            elif options is not None and current.options != options:
                raise ValueError(f"a MoE layer already has our dispatcher with other options ({current.options}); "
                                 "swapping again would silently keep those")
            count += 1
    return count


def use_backend_dispatcher(layer_spec: Any, options: DispatcherOptions | None = None) -> Any:
    """A copy of a Megatron layer/block spec whose MoE layers are `MoEBackendLayer`.

    Walks `ModuleSpec`s, submodule dataclasses, lists and `functools.partial`s, replacing any
    builder of `MoELayer` (e.g. `partial(MoELayer, submodules=...)`) by the same with ours.
    """
    if isinstance(layer_spec, functools.partial):
        func = layer_spec.func
        if isinstance(func, type) and issubclass(func, MoELayer):
            return functools.partial(MoEBackendLayer, *layer_spec.args, **{**layer_spec.keywords, "options": options})
        return functools.partial(func, *layer_spec.args,
                                 **{k: use_backend_dispatcher(v, options) for k, v in layer_spec.keywords.items()})
    if isinstance(layer_spec, type) and issubclass(layer_spec, MoELayer):
        return functools.partial(MoEBackendLayer, options=options)
    if isinstance(layer_spec, (list, tuple)):
        return type(layer_spec)(use_backend_dispatcher(s, options) for s in layer_spec)
    if dataclasses.is_dataclass(layer_spec) and not isinstance(layer_spec, type):
        changes = {f.name: use_backend_dispatcher(getattr(layer_spec, f.name), options)
                   for f in dataclasses.fields(layer_spec) if f.init and hasattr(layer_spec, f.name)}
        copy = dataclasses.replace(layer_spec, **changes)
        # ModuleSpec.module may itself be the MoELayer class (spec-style builds).
        return copy
    return layer_spec


def select_dispatcher(name: str, config=None, **option_overrides: Any) -> DispatcherOptions | None:
    """`nvshmem`/`reference` -> our options (config untouched); Megatron's names set the config.

    Our dispatchers keep `config.moe_token_dispatcher_type` at a stock value, so saved
    arguments load without this package.
    """
    if name in OUR_DISPATCHERS:
        return DispatcherOptions(backend=name, **option_overrides)
    if name in MEGATRON_DISPATCHERS:
        if option_overrides:
            raise ValueError(f"options {sorted(option_overrides)} only apply to {OUR_DISPATCHERS}")
        if config is not None:
            config.moe_token_dispatcher_type = name
        return None
    raise ValueError(f"dispatcher must be one of {DISPATCHERS}, got {name!r}")


def gpt_layer_spec(dispatcher: str = "nvshmem", use_te: bool | None = None, moe_grouped_gemm: bool = False,
                   options: DispatcherOptions | None = None, **kwargs: Any):
    """A GPT MoE layer spec using `dispatcher` (ours, or Megatron's own by name)."""
    from megatron.core.models.gpt import gpt_layer_specs

    if dispatcher not in DISPATCHERS:
        raise ValueError(f"dispatcher must be one of {DISPATCHERS}, got {dispatcher!r}")
    if options is not None and dispatcher in MEGATRON_DISPATCHERS:
        raise ValueError(f"options only apply to {OUR_DISPATCHERS}; Megatron's {dispatcher!r} would ignore them")
    if options is not None and options.backend not in ("auto", dispatcher):
        raise ValueError(f"dispatcher {dispatcher!r} with options.backend={options.backend!r}: pick one")

    if use_te is None:
        from megatron.core.extensions.transformer_engine import HAVE_TE

        use_te = HAVE_TE
    specs = gpt_layer_specs
    build = specs.get_gpt_layer_with_transformer_engine_spec if use_te else specs.get_gpt_layer_local_spec
    spec = build(num_experts=kwargs.pop("num_experts", 2), moe_grouped_gemm=moe_grouped_gemm, **kwargs)
    if dispatcher in MEGATRON_DISPATCHERS:
        return spec
    return use_backend_dispatcher(spec, options or select_dispatcher(dispatcher))
