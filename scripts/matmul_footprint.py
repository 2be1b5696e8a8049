"""What the overlap row's matmul asks of the GPU: its kernels' grids, blocks, registers and
shared memory as the CUDA profiler reports them, against the SM's limits. A kernel whose
blocks each need a whole SM leaves no room for a communication block beside it, so every SM
that a send or receive block holds delays one of its blocks.

    python3 scripts/matmul_footprint.py [--dim 2048] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile


def kernel_records(dim: int) -> list[dict]:
    a = torch.randn(dim, dim, device="cuda").to(torch.bfloat16)
    for _ in range(3):
        torch.mm(a, a)  # the library's choice is made and cached before the traced call
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.mm(a, a)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    keys = ("grid", "block", "registers per thread", "shared memory", "blocks per SM", "warps per SM",
            "est. achieved occupancy %")
    return [{"name": e["name"], "us": e.get("dur"), **{k: e["args"].get(k) for k in keys}}
            for e in events if e.get("cat") == "kernel"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=2048, help="the square bf16 matmul's size (the bench's: 2048)")
    ap.add_argument("--out", help="also write the report as JSON here")
    args = ap.parse_args()
    prop = torch.cuda.get_device_properties(0)
    report = {
        "device": prop.name,
        "sms": prop.multi_processor_count,
        "registers_per_sm": prop.regs_per_multiprocessor,
        "shared_memory_per_sm": prop.shared_memory_per_multiprocessor,
        "dim": args.dim,
        "kernels": kernel_records(args.dim),
    }
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
