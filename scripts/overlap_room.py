"""What room the overlap row's matmul leaves for communication kernels beside it.

1. Its kernels' grids, blocks, registers and shared memory as the CUDA profiler reports them,
   against the SM's limits: a kernel whose blocks each take nearly a whole SM leaves room for
   no ordinary communication block, so every SM that a send or receive block holds delays one
   of its blocks.
2. A co-residence test: a waiting kernel of one block per SM (each block sleeps as long as the
   matmul takes), launched on a second stream just before the matmul, with 1, 2, 4 and 8 warps
   per block: small blocks may fit in the registers a matmul block leaves of an SM, larger
   ones cannot. `ratio` = both together / the longer alone: ~1 means they ran side by side,
   ~2 one after the other.
3. The same for a copy within the GPU by `cudaMemcpyAsync` (torch's `copy_` of a contiguous
   tensor), sized to last about as long as the matmul: ~1 if the copy engines move it, ~2 if
   it needs the SMs.

    python3 scripts/overlap_room.py [--dim 2048] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from trace_waits import kernels  # noqa: E402  (scripts/ is this script's own folder on sys.path)

from moe_backend.bench import machine_info, time_after_barrier  # noqa: E402


@triton.jit
def wait_kernel(out_ptr, ns):
    """Each block waits `ns` nanoseconds of the GPU's clock, mostly asleep: it holds its SM's
    resources but hardly issues, like a receive block waiting for a flag."""
    pid = tl.program_id(0)
    t0 = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False, pack=1)
    t = t0
    while t - t0 < ns:
        t = tl.inline_asm_elementwise("nanosleep.u32 500;\n\tmov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64,
                                      is_pure=False, pack=1)
    tl.store(out_ptr + pid, (t - t0).to(tl.float32))


def median_us(body: Callable[[], object], reps: int = 50) -> float:
    """Timed like the benchmark's ops: a GPU sleep first (the host queues `body` before it
    starts), then CUDA events around it."""
    return time_after_barrier(torch.device("cuda", torch.cuda.current_device()), body, reps, 3)["median"]


def median_us_beside_matmul(a: torch.Tensor, work: Callable[[], object]) -> float:
    """`work` launched on a second stream, then the matmul a @ a on this one: both, joined."""
    side = torch.cuda.Stream()

    def both() -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            work()
        torch.mm(a, a)
        torch.cuda.current_stream().wait_stream(side)

    return median_us(both)


def wait_beside(a: torch.Tensor, sms: int, warps: int, mm_us: float) -> dict:
    """One block per SM of `warps` warps, waiting as long as the matmul takes, alone and then
    launched on a second stream just before the matmul."""
    out = torch.empty(sms, device="cuda")
    ns = int(mm_us * 1000)

    def wait() -> None:
        wait_kernel[(sms,)](out, ns, num_warps=warps)

    compiled = wait_kernel[(sms,)](out, ns, num_warps=warps)  # the launch returns the compiled kernel
    wait_us, both_us = median_us(wait), median_us_beside_matmul(a, wait)
    return {"warps_per_block": warps, "registers_per_thread": compiled.n_regs, "blocks": sms, "wait_us": wait_us,
            "matmul_us": mm_us, "together_us": both_us, "ratio": both_us / max(wait_us, mm_us)}


def memcpy_beside(a: torch.Tensor, mm_us: float) -> dict:
    """A device-to-device copy of about the matmul's length, alone and then launched on a
    second stream just before the matmul."""
    nbytes = 1 << 20
    src = dst = torch.empty(0)

    def copy() -> None:
        dst.copy_(src)

    while True:
        src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        if median_us(copy, 10) >= mm_us:
            break
        nbytes *= 2

    copy_us, both_us = median_us(copy), median_us_beside_matmul(a, copy)
    return {"bytes": nbytes, "copy_us": copy_us, "matmul_us": mm_us, "together_us": both_us,
            "ratio": both_us / max(copy_us, mm_us)}


def coresidence(dim: int, sms: int) -> dict:
    a = torch.randn(dim, dim, device="cuda").to(torch.bfloat16)
    mm_us = median_us(lambda: torch.mm(a, a))
    return {"matmul_us": mm_us, "wait_kernel": [wait_beside(a, sms, warps, mm_us) for warps in (1, 2, 4, 8)],
            "memcpy": memcpy_beside(a, mm_us)}


def kernel_records(dim: int) -> list[dict]:
    a = torch.randn(dim, dim, device="cuda").to(torch.bfloat16)
    for _ in range(3):
        torch.mm(a, a)  # the library's choice is made and cached before the traced call
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.mm(a, a)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = kernels(path)
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
        "machine": {**machine_info(), "triton": triton.__version__},
        "device": prop.name,
        "sms": prop.multi_processor_count,
        "registers_per_sm": prop.regs_per_multiprocessor,
        "shared_memory_per_sm": prop.shared_memory_per_multiprocessor,
        "dim": args.dim,
        "kernels": kernel_records(args.dim),
        "coresidence": coresidence(args.dim, prop.multi_processor_count),
    }
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
