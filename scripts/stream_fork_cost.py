#!/usr/bin/env python3
"""What the split ops' stream layout costs on one GPU (diagnostic).

Two spin kernels stand in for a send (A) and a receive (B) that run concurrently. Each layout
is timed like the ops (CUDA events on the caller's stream around it; median of many):
  b_only       B alone on the caller's stream (one launch)
  one_stream   A then B on the caller's stream (no concurrency: the floor of two launches)
  recv_side    A on the caller's stream, B on a side stream forked before A and joined after
               (the overlapped dispatch and combine today)
  send_side    A on a side stream, B on the caller's stream, the side stream joined after B
Prints each layout's median and what it costs over B alone.
"""

from __future__ import annotations

import argparse
import statistics

import torch


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
    samples = []
    for _ in range(iters):
        torch.cuda._sleep(200_000)  # the host runs ahead: launches do not show in the timing
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(main)
        if layout == "b_only":
            torch.cuda._sleep(b_cycles)
        elif layout == "one_stream":
            torch.cuda._sleep(a_cycles)
            torch.cuda._sleep(b_cycles)
        else:
            fork = torch.cuda.Event()
            fork.record(main)
            side.wait_event(fork)
            first, second = (main, side) if layout == "recv_side" else (side, main)
            with torch.cuda.stream(first):
                torch.cuda._sleep(a_cycles)
            with torch.cuda.stream(second):
                torch.cuda._sleep(b_cycles)
            join = torch.cuda.Event()
            join.record(side)
            main.wait_event(join)
        end.record(main)
        samples.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in samples)


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
