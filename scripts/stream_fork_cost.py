#!/usr/bin/env python3
"""What the split ops' stream layout costs on one GPU (diagnostic).

Two spin kernels stand in for a send (A) and a receive (B) that run concurrently. Each layout
is timed like the ops (`moe_backend.bench.time_after_barrier`: a GPU sleep, then CUDA events
around it; median of many):
  b_only       B alone on the caller's stream (one launch)
  one_stream   A then B on the caller's stream (no concurrency: the floor of two launches)
  recv_side    A on the caller's stream, B on a side stream forked before A and joined after
               (the overlapped dispatch and combine today)
  send_side    A on a side stream, B on the caller's stream, the side stream joined after B
Prints each layout's median and what it costs over B alone.
"""

from __future__ import annotations

import argparse

import torch

from moe_backend.bench import time_after_barrier


def spin_cycles_per_us() -> float:
    """Cycles per microsecond of torch.cuda._sleep, measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 2_000_000
    torch.cuda._sleep(cycles)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    return cycles / (start.elapsed_time(end) * 1000.0)


def time_layout(layout: str, a_cycles: int, b_cycles: int, iters: int) -> float:
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()

    def body() -> None:
        if layout == "b_only":
            torch.cuda._sleep(b_cycles)
        elif layout == "one_stream":
            torch.cuda._sleep(a_cycles)
            torch.cuda._sleep(b_cycles)
        else:
            side.wait_stream(main)
            first, second = (main, side) if layout == "recv_side" else (side, main)
            with torch.cuda.stream(first):
                torch.cuda._sleep(a_cycles)
            with torch.cuda.stream(second):
                torch.cuda._sleep(b_cycles)
            main.wait_stream(side)

    return time_after_barrier(torch.device("cuda", torch.cuda.current_device()), body, iters, 5)["median"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--send-us", type=float, default=3.0, help="length of kernel A (the send)")
    ap.add_argument("--recv-us", type=float, default=8.0, help="length of kernel B (the receive)")
    ap.add_argument("--iters", type=int, default=500)
    args = ap.parse_args()
    rate = spin_cycles_per_us()
    a, b = int(args.send_us * rate), int(args.recv_us * rate)
    alone = time_layout("b_only", a, b, args.iters)
    print(f"spin rate {rate:.0f} cycles/us; B alone {alone:.2f} us")
    for layout in ("b_only", "one_stream", "recv_side", "send_side"):
        t = time_layout(layout, a, b, args.iters)
        print(f"{layout:<12} {t:7.2f} us  (+{t - alone:.2f} over B alone)")


if __name__ == "__main__":
    main()
