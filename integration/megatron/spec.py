"""Ready-made layer spec for `pretrain_gpt.py --spec integration.megatron.spec gpt_layer_spec`.

Chosen by environment variables (read at import): MOE_BACKEND_DISPATCHER (nvshmem |
reference | alltoall | allgather | flex; default nvshmem), MOE_BACKEND_GROUPED_GEMM (0/1),
MOE_BACKEND_HOST_TOKENS_PER_EXPERT (1/0). Keep Megatron's `--moe-token-dispatcher-type`
at a stock value (e.g. alltoall): checkpoints then load without this package.
"""

from __future__ import annotations

import os

from .layer import DISPATCHERS, OUR_DISPATCHERS, select_dispatcher
from .layer import gpt_layer_spec as _gpt_layer_spec


def _switch(name: str, default: str) -> bool:
    value = os.environ.get(name, default)
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


_name = os.environ.get("MOE_BACKEND_DISPATCHER", "nvshmem")
if _name not in DISPATCHERS:
    raise ValueError(f"MOE_BACKEND_DISPATCHER must be one of {DISPATCHERS}, got {_name!r}")
_options = (
    select_dispatcher(_name, host_tokens_per_expert=_switch("MOE_BACKEND_HOST_TOKENS_PER_EXPERT", "1"))
    if _name in OUR_DISPATCHERS
    else None
)
gpt_layer_spec = _gpt_layer_spec(_name, moe_grouped_gemm=_switch("MOE_BACKEND_GROUPED_GEMM", "0"), options=_options)
