"""A pool of N long-lived ranks (torch.distributed initialised once) that run test bodies.

Spawning processes costs seconds; the contract suite and hypothesis run hundreds of cases,
so the ranks stay up and receive `fn(*args)` tasks through queues.
"""

from __future__ import annotations

import queue
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from moe_backend.launch import join_group, rendezvous_store


def _serve(rank: int, world: int, port: int, dist_backend: str, tasks: Any, results: Any) -> None:
    join_group(dist_backend, rank, world, port)
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args = task
        try:
            results.put((rank, fn(*args), None))
        except BaseException:  # the parent re-raises with every rank's traceback
            results.put((rank, None, traceback.format_exc()))
    dist.destroy_process_group()


class RankPool:
    def __init__(self, world: int, dist_backend: str = "gloo"):
        self.world = world
        ctx = mp.get_context("spawn")
        self._tasks = [ctx.Queue() for _ in range(world)]
        self._results = ctx.Queue()
        self._store = rendezvous_store(world)  # held while the ranks live
        port = self._store.port
        self._procs = [
            ctx.Process(target=_serve, args=(r, world, port, dist_backend, self._tasks[r], self._results), daemon=True)
            for r in range(world)
        ]
        for p in self._procs:
            p.start()
        self.broken = False

    def run(self, fn: Callable, *args: Any, timeout: float = 300) -> list[Any]:
        """Run `fn(*args)` on every rank; return the per-rank results or raise."""
        if self.broken:
            raise RuntimeError("rank pool is broken by an earlier hang")
        for q in self._tasks:
            q.put((fn, args))
        out: list[Any] = [None] * self.world
        errors = []
        for _ in range(self.world):
            try:
                rank, value, err = self._results.get(timeout=timeout)
            except queue.Empty:
                self.broken = True
                raise TimeoutError(f"ranks did not answer within {timeout} s") from None
            out[rank] = value
            if err:
                errors.append((rank, err))
        if errors:
            raise AssertionError("\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors)))
        return out

    def close(self) -> None:
        if not self.broken:
            for q in self._tasks:
                q.put(None)
        for p in self._procs:
            p.join(10)
            if p.is_alive():
                p.kill()
