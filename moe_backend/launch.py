"""Run a function on N local processes with torch.distributed set up (gloo or NCCL).

Used by the CLI (when not started under torchrun) and by the multi-process tests.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rendezvous_store(world_size: int) -> dist.TCPStore:
    """A store for `world_size` local ranks, held by this (parent) process: it binds a port
    the OS picks, so no rank can find its port taken (a port picked first and bound later by
    a worker could be). Keep it alive while the ranks run; they join with `join_group`."""
    return dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)


def join_group(dist_backend: str, rank: int, world_size: int, port: int) -> None:
    """Initialise the default process group as a client of the parent's store on `port`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    if dist_backend == "nccl":
        torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False)
    dist.init_process_group(dist_backend, store=store, rank=rank, world_size=world_size)


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def init_process_group(dist_backend: str) -> None:
    """Initialise from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK)."""
    if dist_backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(dist_backend)


def _worker(rank: int, world: int, port: int, dist_backend: str, fn: Callable, args: tuple, errors: Any) -> None:
    try:
        join_group(dist_backend, rank, world, port)
        fn(*args)
    except BaseException:  # report every rank's failure to the parent
        errors.put((rank, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn: Callable, world_size: int, *args: Any, dist_backend: str = "gloo", timeout: float = 600) -> None:
    """Run `fn(*args)` on `world_size` fresh processes; raise with each failing rank's traceback."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    store = rendezvous_store(world_size)
    procs = [
        ctx.Process(target=_worker, args=(r, world_size, store.port, dist_backend, fn, args, errors), daemon=False)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    if failures:
        detail = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(failures))
        raise RuntimeError(f"{len(failures)} rank(s) failed:\n{detail}")
    if hung:
        raise RuntimeError(f"ranks {hung} did not finish within {timeout} s")
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"ranks exited abnormally: {bad}")


def local_dist_backend(local_world: int) -> str:
    """NCCL when every local rank has a GPU of its own, else gloo."""
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local_world else "gloo"


def run_everywhere(fn: Callable[..., None], world_size: int, *args: Any, timeout: float = 600,
                   announce: Callable[[str], None] | None = None) -> None:
    """Run `fn(*args)` on every rank: torchrun's when started by it (the backend chosen by the
    ranks on this node), else `world_size` local processes. `fn` must be importable (defined at
    module level) for the local processes to find it."""
    if under_torchrun():
        init_process_group(local_dist_backend(int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))))
        try:
            fn(*args)
        finally:
            dist.destroy_process_group()
        return
    backend = local_dist_backend(world_size)
    if announce is not None:
        announce(f"starting {world_size} local processes ({backend})")
    spawn(fn, world_size, *args, dist_backend=backend, timeout=timeout)
