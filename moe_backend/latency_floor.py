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

from .bench import max_over_ranks, time_after_barrier

VARIANTS = {"1_launch": 1, "2_launches": 2}


def measure(device: torch.device, iters: int = 200, warmup: int = 10,
            timeout_s: float = 5.0) -> dict[str, dict[str, float]] | None:
    """p10 / median / p90 us per variant (slowest rank); None where it cannot run (no CUDA, no
    extension, or a peer not reachable over NVLink). Collective: call on every rank."""
    from .backends import nvshmem_available

    if device.type != "cuda" or not nvshmem_available(device)[0]:
        return None
    from .backends import nvshmem_runtime as rt

    world = dist.get_world_size()
    with rt.peer_scratch(device, 8 * world) as (flags, peers):  # zeroed: one flag per sender
        if peers is None:
            return None
        o, rank = rt.ops(), dist.get_rank()
        err = torch.zeros(1, dtype=torch.int32, device=device)
        rounds = iter(range(1, 1 << 62))
        per_variant = {
            name: time_after_barrier(device, lambda n=launches: o.ping(err, flags, peers, rank, next(rounds), n,
                                                                       int(timeout_s * 1e9)), iters, warmup)
            for name, launches in VARIANTS.items()}
        torch.cuda.synchronize(device)
        if int(err.item()):
            raise RuntimeError("latency floor: a peer's store never arrived (timeout)")
        return max_over_ranks(per_variant)
