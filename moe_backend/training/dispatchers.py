"""Dispatcher selection by name, for the training path.

`alltoall`, `allgather`, `flex` are megatron-core's own dispatchers (chosen through
`TransformerConfig.moe_token_dispatcher_type`). `reference` and `nvshmem` are ours, from
`integration.megatron`; this module is the only place the trainer touches that package,
so a change in its API is absorbed here.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import torch

from ..config import ConfigError

MEGATRON_BUILTIN = ("alltoall", "allgather", "flex")
OURS = ("reference", "nvshmem")


def nvshmem_ready() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    from ..backends import nvshmem_available

    return nvshmem_available()


def resolve(name: str, on_gpu: bool) -> str:
    """`auto` -> `nvshmem` where the kernels can run, else `reference`."""
    if name != "auto":
        return name
    return "nvshmem" if on_gpu and nvshmem_ready()[0] else "reference"


def _integration() -> Any:
    try:
        return importlib.import_module("integration.megatron")
    except ImportError as err:
        raise ConfigError(f"dispatcher: ours needs integration.megatron, which does not import: {err}") from None


def megatron_type(name: str) -> str:
    """The `moe_token_dispatcher_type` saved in the config: a stock value for ours (their
    layer builds its own dispatcher), so checkpoints load without this package."""
    return name if name in MEGATRON_BUILTIN else "alltoall"


def available(on_gpu: bool) -> dict[str, str]:
    """Dispatchers that can run here -> '' if usable, else why not."""
    out: dict[str, str] = {}
    for name in OURS + MEGATRON_BUILTIN:
        if not on_gpu and name != "reference":
            out[name] = "needs CUDA"
        elif name == "nvshmem":
            ok, why = nvshmem_ready()
            out[name] = "" if ok else why
        elif name == "flex":
            out[name] = _flex_missing()
        elif name in OURS:
            try:
                _integration()
                out[name] = ""
            except ConfigError as err:
                out[name] = str(err)
        else:
            out[name] = ""
    return out


def _flex_missing() -> str:
    """flex needs one of DeepEP / HybridEP (their Python packages)."""
    for pkg in ("deep_ep", "hybrid_ep"):
        if importlib.util.find_spec(pkg) is not None:
            return ""
    return "needs DeepEP or HybridEP (not installed)"


def option_overrides(name: str, opts: Any) -> dict[str, Any]:
    """`DispatcherOptions` fields from the config's `dispatcher_options` for our dispatcher `name`
    (the backend options only where the backend takes them: nvshmem)."""
    out: dict[str, Any] = {"check_inputs": opts.check_inputs, "combine_in_float32": opts.combine_in_float32}
    if name == "nvshmem":
        backend = {"transport": opts.transport, "timeout_s": opts.timeout_s}
        if opts.num_sms is not None:
            backend["num_sms"] = opts.num_sms
        if opts.send_stream:
            backend["send_stream"] = True
        out["backend_options"] = tuple(sorted(backend.items()))
    return out


NVSHMEM_ONLY = ("transport", "timeout_s", "num_sms", "send_stream")


def ignored_options(name: str, opts: Any) -> list[str]:
    """The `dispatcher_options` keys set away from their defaults that dispatcher `name` does
    not use (all of them for Megatron's own, the nvshmem backend's for `reference`)."""
    if opts is None or name == "nvshmem":
        return []
    default = type(opts)()
    keys = NVSHMEM_ONLY if name == "reference" else [f.name for f in dataclasses.fields(opts)]
    return [k for k in keys if getattr(opts, k) != getattr(default, k)]


def with_dispatcher(spec: Any, name: str, opts: Any = None) -> Any:
    """The layer spec with our dispatcher's MoE layer (`integration.megatron.use_backend_dispatcher`),
    configured by `opts` (a `DispatcherOptionsConfig`; None: the defaults).

    Megatron's own names return `spec` unchanged (the config's dispatcher type selects them).
    """
    if name in MEGATRON_BUILTIN:
        return spec
    mod = _integration()
    overrides = option_overrides(name, opts) if opts is not None else {}
    return mod.use_backend_dispatcher(spec, mod.select_dispatcher(name, **overrides))


def release() -> None:
    """Drop our cached communicators (their process groups die with the model-parallel state)."""
    import sys

    mod = sys.modules.get("integration.megatron")
    if mod is not None and hasattr(mod, "clear_cache"):
        mod.clear_cache()
