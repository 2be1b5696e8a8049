"""The latency floor of a GPU-initiated exchange between the ranks, for the benchmark.

Each rank stores a round number into its slot at every peer over NVLink and waits for every
peer's store. `1_launch` does both in one kernel; `2_launches` stores in one kernel and waits
in a second on the same stream: the fewest launches a split dispatch (a send kernel, then a
receive kernel) can have. Timed like the ops (GPU barrier, CUDA events around the call,
median per rank, slowest rank), it is what no one-token dispatch or combine can beat here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .bench import Clock, barrier, max_over_ranks, stats

VARIANTS = {"1_launch": 1, "2_launches": 2}


def measure(device: torch.device, iters: int = 200, warmup: int = 10,
            timeout_s: float = 5.0) -> dict[str, dict[str, float]] | None:
    """p10 / median / p90 us per variant (slowest rank); None where it cannot run (no CUDA, no
    extension, or a peer not reachable over NVLink). Collective: call on every rank."""
    from .backends import nvshmem_available

    if device.type != "cuda" or not nvshmem_available()[0]:
        return None
    from .backends import nvshmem_runtime as rt

    pes = rt.ensure_initialised(None, device)
    o = rt.ops()
    flags = int(o.sym_malloc(8 * len(pes)))  # collective; zeroed
    try:
        peers = [int(o.peer_ptr(flags, pe)) for pe in pes]
        reachable = torch.tensor([1 if all(peers) else 0], device=device)
        dist.all_reduce(reachable, op=dist.ReduceOp.MIN)
        if not reachable.item():
            return None
        return _time(o, device, flags, peers, iters, warmup, int(timeout_s * 1e9))
    finally:
        torch.cuda.synchronize(device)
        dist.barrier()
        o.sym_free(flags)  # collective


def _time(o, device: torch.device, flags: int, peers: list[int], iters: int, warmup: int,
          timeout_ns: int) -> dict[str, dict[str, float]]:
    clock, rank = Clock(device), dist.get_rank()
    flag = torch.ones(1, device=device)
    err = torch.zeros(1, dtype=torch.int32, device=device)
    round_ = 0
    per_variant = {}
    for name, launches in VARIANTS.items():
        samples = []
        for i in range(warmup + iters):
            barrier(device, flag)
            round_ += 1
            m0 = clock.mark()
            o.ping(err, flags, peers, rank, round_, launches, timeout_ns)
            m1 = clock.mark()
            if i >= warmup:
                clock.sync()
                samples.append(clock.elapsed_us(m0, m1))
        per_variant[name] = stats(samples)
    torch.cuda.synchronize(device)
    if int(err.item()):
        raise RuntimeError("latency floor: a peer's store never arrived (timeout)")
    return max_over_ranks(per_variant)
