"""Optional torch.profiler capture of a few training steps (`moe-backend train --profile DIR`).

Steps [start, start + count) run under the profiler; each rank then writes
`DIR/profile_rank<r>.txt`: the wall time of the profiled steps, the GPU busy time (union of
kernel/copy intervals on every stream), the idle share, and the operators and kernels
ranked by their device time, then by their host time; and `trace_rank<r>.json`, the
timeline (chrome://tracing or Perfetto). This is how a step-time gap between dispatchers is
attributed: to kernels that run longer, or to a GPU that waits for the host.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch


class StepProfiler:
    def __init__(self, out_dir: str | None, start: int, count: int = 3, device_only: bool = False):
        self.out_dir = out_dir
        # device_only: kernels only, no host-side operator events. The host then runs at
        # nearly its unprofiled speed, so the timeline shows the unprofiled waits.
        self.device_only = device_only
        self.start, self.count = start, count
        self._prof: Any = None
        self._t0 = 0.0

    def before(self, step: int) -> None:
        if self.out_dir and step == self.start:
            cpu, cuda = torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA
            if not torch.cuda.is_available():
                acts = [cpu]
            else:
                acts = [cuda] if self.device_only else [cpu, cuda]
            self._prof = torch.profiler.profile(activities=acts)
            self._prof.__enter__()
            self._t0 = time.perf_counter()

    def after(self, step: int, rank: int, last: bool) -> None:
        """Stop after the last profiled step (or the run's last step, if that comes first)."""
        if self._prof is None or (step != self.start + self.count - 1 and not last):
            return
        steps = step - self.start + 1
        wall = time.perf_counter() - self._t0
        self._prof.__exit__(None, None, None)
        prof, self._prof = self._prof, None
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        text = summary(prof, wall, steps)
        (Path(self.out_dir) / f"profile_rank{rank}.txt").write_text(text)
        # The full timeline (chrome://tracing, Perfetto): which kernel each rank waits in, and when.
        prof.export_chrome_trace(str(Path(self.out_dir) / f"trace_rank{rank}.json"))


def union_us(spans: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (a GPU's busy time from its kernels)."""
    total, end = 0.0, float("-inf")
    for s, f in sorted(spans):
        if f > end:
            total += f - max(s, end)
            end = f
    return total


def _busy_us(prof: Any) -> float:
    """Length of the union of all device activity intervals (µs)."""
    return union_us(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
    )


def summary(prof: Any, wall_s: float, steps: int) -> str:
    step_ms = wall_s * 1e3 / steps
    head = f"profiled steps: {steps}; wall per step {step_ms:.2f} ms"
    cuda = torch.cuda.is_available()
    if cuda:
        busy = _busy_us(prof) / 1e3 / steps
        head += f"; GPU busy per step {busy:.2f} ms (idle {100 * (1 - busy / step_ms):.1f}%)"
    lines = [head, ""]
    averages = prof.key_averages()
    if cuda:
        lines += ["by device time:", averages.table(sort_by="self_cuda_time_total", row_limit=40,
                                                    max_name_column_width=70), ""]
    # Host time shows what a GPU that waits for the host is waiting for (syncs, launches).
    lines += ["by host time:", averages.table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=70)]
    return "\n".join(lines)
