"""What a given number of SMs can move, for the benchmark: the ceilings of kernels sized for
fewer SMs than the GPU has (`--sms`).

A probe kernel (`rate_probe`: one 1024-thread block per SM, 8 16-byte words in flight per
thread) streams a buffer three ways: loads from this GPU's memory, stores to it, and stores to
the peer's memory over NVLink (every rank at once, as in a dispatch). The combine send, for
example, must load every expert row (~470 MB per GPU at the DeepSeek prefill shape): no
combine given N SMs can beat those bytes at the N-SM load rate.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .bench import _median_seconds, barrier, stats

LOCAL_BYTES = 1 << 30
PEER_BYTES = 64 << 20


def measure(device: torch.device, sms: list[int] | tuple[int, ...] = (), iters: int = 10) -> dict[str, dict] | None:
    """{"<n>_sms": {"sms": n, "load": GB/s, "store": GB/s, "nvlink_store": GB/s}} for every
    SM count in `sms` and the whole GPU; local rates from rank 0's GPU, the NVLink rate from
    the slowest rank. None where it cannot run. Collective: call on every rank."""
    from .backends import nvshmem_available

    if device.type != "cuda" or not nvshmem_available()[0]:
        return None
    from .backends import nvshmem_runtime as rt

    pes = rt.ensure_initialised(None, device)
    o = rt.ops()
    total = int(o.num_sms(device.index))
    counts = sorted({total, *(n for n in sms if 0 < n < total)}, reverse=True)
    rank = dist.get_rank()
    peer = pes[(pes.index(rank) + 1) % len(pes)] if rank in pes else pes[0]
    buf = int(o.sym_malloc(PEER_BYTES))  # collective
    try:
        target = int(o.peer_ptr(buf, peer))
        reachable = torch.tensor([1 if target and len(pes) > 1 else 0], device=device)
        dist.all_reduce(reachable, op=dist.ReduceOp.MIN)
        result = {}
        for n in counts:
            rates = _local_rates(o, device, n, iters) if rank == 0 else {}
            if reachable.item():
                rates["nvlink_store"] = _peer_store_rate(o, device, target, n, iters)
            result[f"{n}_sms"] = {"sms": n, **rates}
        gathered: list[dict] = [{}] * dist.get_world_size()
        dist.all_gather_object(gathered, result)
        for key, entry in result.items():  # the local rates are rank 0's; the link the slowest rank's
            entry.update(gathered[0][key])
            links = [g[key]["nvlink_store"] for g in gathered if "nvlink_store" in g.get(key, {})]
            if links:
                entry["nvlink_store"] = min(links)
        return result
    finally:
        torch.cuda.synchronize(device)
        dist.barrier()
        o.sym_free(buf)  # collective


def _local_rates(o, device: torch.device, blocks: int, iters: int) -> dict[str, float]:
    src = torch.randint(0, 255, (LOCAL_BYTES,), dtype=torch.uint8, device=device)
    dst = torch.empty(LOCAL_BYTES, dtype=torch.uint8, device=device)
    sink = torch.zeros(blocks * 16, dtype=torch.uint8, device=device)
    d, s, k, i = dst.data_ptr(), src.data_ptr(), sink.data_ptr(), device.index
    return {"load": LOCAL_BYTES / _median_seconds(lambda: o.rate_probe(k, s, LOCAL_BYTES, 1, blocks, i), iters) / 1e9,
            "store": LOCAL_BYTES / _median_seconds(lambda: o.rate_probe(d, 0, LOCAL_BYTES, 0, blocks, i), iters) / 1e9}


def _peer_store_rate(o, device: torch.device, target: int, blocks: int, iters: int) -> float:
    """Every rank stores PEER_BYTES into the next rank's buffer at once; GB/s one way."""
    flag = torch.ones(1, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for i in range(iters + 3):
        barrier(device, flag)
        start.record()
        o.rate_probe(target, 0, PEER_BYTES, 0, blocks, device.index)
        end.record()
        end.synchronize()
        if i >= 3:
            samples.append(start.elapsed_time(end) / 1e3)
    return PEER_BYTES / stats(samples)["median"] / 1e9
