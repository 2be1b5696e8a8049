"""Quick 2-GPU latency of one dispatch+combine round: nvshmem (put, nvlink) vs reference.

    python tests/gpu/bench_nvshmem.py --out bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from moe_backend import launch  # noqa: E402
from moe_backend.communicator import Communicator  # noqa: E402
from moe_backend.spec import FP8, CommSpec  # noqa: E402

CONFIGS = [  # name, spec kwargs, tokens per rank
    ("deepseek-decode-bf16", dict(num_experts=256, topk=8, hidden=7168), 128),
    ("deepseek-decode-fp8", dict(num_experts=256, topk=8, hidden=7168, in_dtype=FP8, scale_block_size=128), 128),
    ("deepseek-prefill-bf16", dict(num_experts=256, topk=8, hidden=7168), 4096),
    ("mixtral-bf16", dict(num_experts=8, topk=2, hidden=4096), 1024),
]


def _worker(path):
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    results = []
    for name, kw, tokens in CONFIGS:
        spec = CommSpec(max_num_tokens=tokens, world_size=world, **kw)
        gen = torch.Generator(device=dev).manual_seed(rank)
        x = torch.randn(tokens, spec.hidden, device=dev, generator=gen).to(spec.in_dtype)
        scale = torch.rand(tokens, spec.num_scales, device=dev) + 0.5 if spec.in_dtype == FP8 else None
        ids = torch.rand(tokens, spec.num_experts, device=dev, generator=gen).argsort(1)[:, : spec.topk].int()
        w = torch.rand(tokens, spec.topk, device=dev)
        for backend, opts in (("nvshmem", {"transport": "nvlink"}), ("nvshmem", {"transport": "put"}),
                              ("reference", {})):
            comm = Communicator(spec, backend=backend, check_inputs=False, **opts)

            def once_timed(ev, comm=comm, x=x, ids=ids, w=w, scale=scale, spec=spec):
                ev[0].record()
                res = comm.dispatch(x, ids, w, scale)
                ev[1].record()
                y = res.tokens.to(spec.out_dtype)
                ev[2].record()
                comm.combine(y, res.handle, res.weights)
                ev[3].record()

            for _ in range(3):
                once_timed([torch.cuda.Event() for _ in range(4)])
            torch.cuda.synchronize()
            iters = 20
            evs = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(iters)]
            dist.barrier()
            for ev in evs:
                once_timed(ev)
            torch.cuda.synchronize()
            disp = sorted(e[0].elapsed_time(e[1]) * 1e3 for e in evs)[iters // 2]
            comb = sorted(e[2].elapsed_time(e[3]) * 1e3 for e in evs)[iters // 2]
            label = backend + (f"/{opts['transport']}" if opts else "")
            row = dict(config=name, backend=label, tokens=tokens, dispatch_us=round(disp, 1),
                       combine_us=round(comb, 1), total_us=round(disp + comb, 1))
            if rank == 0:
                print(json.dumps(row), flush=True)
            results.append(row)
            comm.close()
    if rank == 0 and path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    if torch.cuda.device_count() < 2:
        print("bench: needs 2 GPUs; skipped")
        sys.exit(0)
    launch.spawn(_worker, 2, args.out, dist_backend="nccl", timeout=150)
