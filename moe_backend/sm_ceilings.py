"""What a given number of SMs can move, for the benchmark: the ceilings of kernels sized for
fewer SMs than the GPU has (`--sms`).

A probe kernel (`rate_probe`: one 1024-thread block per SM, 8 16-byte words in flight per
thread) streams a buffer several ways (PROBES): loads from this GPU's memory (by SM loads, and
by bulk (TMA) copies into shared memory in the few-SM combine's ring shape, of 2 KB as its row
pieces, of 1 KB, 4 KB and 512 B), stores to it (by SM stores, and by 16 KB bulk copies from shared
memory), and stores to the peer's memory over NVLink (every rank at once, as in a dispatch).
The combine send, for example, must load every expert row (~470 MB per GPU at the DeepSeek
prefill shape): no combine given N SMs can beat those bytes at the N-SM load rate. The bulk
rates are those of the probe's shape (contiguous stages, one lane issuing), not bounds: the
24-SM combine's own 2 KB copies moved more than the 2 KB probe (round 31).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist

from .bench import gather_objects, max_over_ranks, median_seconds, time_after_barrier

LOCAL_BYTES = 1 << 30
PEER_BYTES = 64 << 20
# The local rates, in report order: rate_probe's mode for each and whether it loads (from a
# source into a word per block) or stores (into the destination).
PROBES = {"load": (1, True), "bulk_load": (3, True), "bulk_load_2kb": (6, True), "bulk_load_4kb": (4, True),
          "bulk_load_512b": (5, True), "store": (0, False), "bulk_store": (2, False)}


def measure(device: torch.device, sms: list[int] | tuple[int, ...] = (), iters: int = 10) -> dict[str, dict] | None:
    """{"<n>_sms": {"sms": n, <each of PROBES>: GB/s, "nvlink_store": GB/s}} for every SM count in
    `sms` and the whole GPU; local rates from rank 0's GPU, the NVLink rate from the slowest rank
    (absent where a peer is not reachable). None where it cannot run.
    Collective: call on every rank."""
    from .backends import nvshmem_available

    if device.type != "cuda" or not nvshmem_available(device)[0]:
        return None
    from .backends import nvshmem_runtime as rt

    o = rt.ops()
    total = int(o.num_sms(device.index))
    counts = sorted({total, *(n for n in sms if 0 < n < total)}, reverse=True)
    local = gather_objects(_local_rates(o, device, counts, iters) if dist.get_rank() == 0 else None)[0]
    with rt.peer_scratch(device, PEER_BYTES) as (_, peers):
        result = {}
        for n in counts:
            entry = {"sms": n, **local[n]}
            if peers is not None and len(peers) > 1:
                target = peers[(dist.get_rank() + 1) % len(peers)]
                def store(target: int = target, n: int = n) -> None:
                    o.rate_probe(target, 0, PEER_BYTES, 0, n, device.index)

                slowest = max_over_ranks({"t": time_after_barrier(device, store, iters, 3)})["t"]
                entry["nvlink_store"] = PEER_BYTES / slowest["median"] / 1e3
            result[f"{n}_sms"] = entry
        return result


def _local_rates(o, device: torch.device, counts: list[int], iters: int) -> dict[int, dict[str, float]]:
    """GB/s of each of PROBES on this GPU's memory for each SM count."""
    src = torch.randint(0, 255, (LOCAL_BYTES,), dtype=torch.uint8, device=device)
    dst = torch.empty(LOCAL_BYTES, dtype=torch.uint8, device=device)
    sink = torch.zeros(max(counts) * 16, dtype=torch.uint8, device=device)  # one word per block
    d, s, k, i = dst.data_ptr(), src.data_ptr(), sink.data_ptr(), device.index
    rates: dict[int, dict[str, float]] = {n: {} for n in counts}
    for n in counts:
        for name, (mode, loads) in PROBES.items():
            target, source = (k, s) if loads else (d, 0)
            seconds = median_seconds(partial(o.rate_probe, target, source, LOCAL_BYTES, mode, n, i), iters)
            rates[n][name] = LOCAL_BYTES / seconds / 1e9
    return rates
