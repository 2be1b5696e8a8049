#!/usr/bin/env python3
"""Host time of the Communicator layer alone: checks, round state, receivers and results.

Runs on a CPU (gloo, world size 1). The communicator's backend is swapped for one that
returns at once with outputs of the right shapes, so what is timed is everything the
public API adds on top of a backend: `comm.dispatch`, then `comm.combine` with its handle,
DeepSeek decode shape (E=256, top-8, H=7168, bf16, 128 tokens). An eager decode step is
host-bound (docs/PERF_NOTES.md, round 36), and this layer runs before every kernel.

    python3 scripts/profile_comm_layer.py [--iters 5000] [--json OUT.json]

Prints (and with --json writes) the median us per call over `--iters` calls, in 20 batches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _null_backend(spec: Any) -> Any:
    """A backend that does no communication: its results have the shapes a real one returns."""
    import torch

    from moe_backend.backends.base import Received

    rows = spec.max_recv_tokens
    got = Received(
        tokens=torch.empty(rows, spec.hidden, dtype=spec.in_dtype), scales=None, weights=None,
        tokens_per_expert=torch.zeros(spec.num_local_experts, dtype=torch.long),
        expert_offsets=torch.zeros(spec.num_local_experts + 1, dtype=torch.long),
        src_group=torch.zeros(rows, dtype=torch.int32), src_token=torch.zeros(rows, dtype=torch.int32),
        src_k=torch.zeros(rows, dtype=torch.int32), backend_state=None,
    )

    class NullBackend:
        name = "null"

        def dispatch_whole(self, *args: Any) -> None:
            return None

        def dispatch_recv(self, pending: Any) -> Received:
            return got

        def combine_whole(self, y: Any, handle: Any, weights: Any, out: Any) -> Any:
            return out

        # The split phases (and the Communicator before round 36, for comparisons).
        dispatch_send = dispatch_whole

        def combine_send(self, *args: Any) -> None:
            return None

        def combine_recv(self, pending: Any, out: Any) -> Any:
            return out

    return NullBackend()


def measure(iters: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    from moe_backend.communicator import Communicator
    from moe_backend.spec import CommSpec

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29581")
        dist.init_process_group("gloo", rank=0, world_size=1)
    spec = CommSpec(256, 8, 7168, 128, 1, in_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    comm = Communicator(spec, backend="reference", device="cpu", check_inputs=False)
    comm.backend = _null_backend(spec)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(128, spec.hidden, generator=gen).to(torch.bfloat16)
    ids = torch.rand(128, spec.num_experts, generator=gen).argsort(dim=1)[:, : spec.topk].to(torch.int32)
    y = torch.randn(spec.max_recv_tokens, spec.hidden, generator=gen).to(torch.bfloat16)
    out = torch.empty(128, spec.hidden, dtype=torch.bfloat16)
    batch = max(1, iters // 20)
    per_call: dict[str, list[float]] = {"dispatch": [], "combine": []}
    for _ in range(20):
        t0 = time.perf_counter()
        for _ in range(batch):
            comm.dispatch(x, ids)
            comm._phase = "idle"  # no combine in this loop: dispatches alone
        per_call["dispatch"].append((time.perf_counter() - t0) / batch * 1e6)
        spent = 0.0
        for _ in range(batch):
            result = comm.dispatch(x, ids)
            t1 = time.perf_counter()
            comm.combine(y, result.handle, out=out)
            spent += time.perf_counter() - t1
        per_call["combine"].append(spent / batch * 1e6)
    medians = {k: statistics.median(v) for k, v in per_call.items()}
    return medians


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=5000, help="calls of each op (20 batches)")
    ap.add_argument("--json", default=None, help="also write the medians here")
    args = ap.parse_args()
    if args.iters < 20:
        ap.error("--iters must be at least 20")
    medians = measure(args.iters)
    for k, v in medians.items():
        print(f"comm.{k:<10} {v:7.2f} us (median of 20 batches, null backend, CPU)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"us_per_call": medians, "iters": args.iters}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
