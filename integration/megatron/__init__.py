"""Megatron-core integration: a token dispatcher over moe_backend, and ways to plug it in.

Needs megatron-core (`pip install moe_backend[megatron]`). See docs/MEGATRON_INTEGRATION.md.
"""

from .cache import clear_cache, get_communicator
from .dispatcher import DispatcherOptions, MoEBackendTokenDispatcher
from .groups import GroupMapping, build_mapping
from .layer import (
    DISPATCHERS,
    MoEBackendLayer,
    gpt_layer_spec,
    select_dispatcher,
    swap_token_dispatchers,
    use_backend_dispatcher,
)
from .routing import PaddedLayout, routing_to_topk, to_virtual

__all__ = [
    "DISPATCHERS",
    "DispatcherOptions",
    "GroupMapping",
    "MoEBackendLayer",
    "MoEBackendTokenDispatcher",
    "PaddedLayout",
    "build_mapping",
    "clear_cache",
    "get_communicator",
    "gpt_layer_spec",
    "routing_to_topk",
    "select_dispatcher",
    "swap_token_dispatchers",
    "to_virtual",
    "use_backend_dispatcher",
]
