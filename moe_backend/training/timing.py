"""Time spent in dispatch and combine, forward and backward, per training step.

Every dispatcher (ours or Megatron's) is measured over the same window: dispatch is
`dispatch_preprocess` .. `dispatch_postprocess` (permutation + transfer + unpermutation),
combine is `combine_preprocess` .. `combine_postprocess`. Megatron runs nothing else
inside those windows. Backward windows run from the moment the gradient of the window's
output is ready (tensor hook) to the moment the gradient of its input is ready; autograd
may slot unrelated ready work in between, so backward times are upper bounds.

On GPU the marks are CUDA events (no synchronisation until `collect`, once per step); on
CPU, where gloo collectives block, wall-clock reads.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..bench import Clock

KINDS = ("dispatch_fwd", "dispatch_bwd", "combine_fwd", "combine_bwd")


class CommTimer(Clock):
    def __init__(self, device: torch.device):
        super().__init__(device)
        self.spans: list[tuple[str, Any, Any]] = []

    def add(self, kind: str, start: Any, end: Any) -> None:
        self.spans.append((kind, start, end))

    def collect(self) -> dict[str, float]:
        """Seconds per kind since the last call (synchronises the GPU once)."""
        if self.cuda and self.spans:
            torch.cuda.synchronize()
        out = dict.fromkeys(KINDS, 0.0)
        for kind, start, end in self.spans:
            out[kind] += start.elapsed_time(end) / 1e3 if self.cuda else end - start
        self.spans.clear()
        return out


def _grad_hook(tensor: Any, fn: Any) -> None:
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
        tensor.register_hook(lambda _grad: fn())


def instrument(dispatcher: Any, timer: CommTimer) -> None:
    """Wrap one token dispatcher's six steps (instance attributes; the class is untouched)."""
    state: dict[str, Any] = {}

    def opening(name: str, phase: str) -> None:
        orig = getattr(dispatcher, name)

        @functools.wraps(orig)
        def wrapped(hidden: Any, *args: Any, **kwargs: Any) -> Any:
            state[phase] = timer.mark()
            span: dict[str, Any] = {}

            def backward_done() -> None:  # the gradient of this input ends the phase's backward
                if "bwd_start" in span:
                    timer.add(f"{phase}_bwd", span["bwd_start"], timer.mark())

            _grad_hook(hidden, backward_done)
            state[f"{phase}_span"] = span
            return orig(hidden, *args, **kwargs)

        setattr(dispatcher, name, wrapped)

    def closing(name: str, phase: str) -> None:
        orig = getattr(dispatcher, name)

        @functools.wraps(orig)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = orig(*args, **kwargs)
            start = state.pop(phase, None)
            span = state.pop(f"{phase}_span", {})
            if start is not None:
                timer.add(f"{phase}_fwd", start, timer.mark())
            first = out[0] if isinstance(out, tuple) else out
            _grad_hook(first, lambda: span.__setitem__("bwd_start", timer.mark()))
            return out

        setattr(dispatcher, name, wrapped)

    opening("dispatch_preprocess", "dispatch")
    closing("dispatch_postprocess", "dispatch")
    opening("combine_preprocess", "combine")
    closing("combine_postprocess", "combine")


def instrument_model(layers: list[Any], timer: CommTimer) -> None:
    for layer in layers:
        instrument(layer.token_dispatcher, timer)
