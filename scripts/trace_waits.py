"""Where each rank's GPU time goes in a `moe-backend train --profile DIR` capture.

    python scripts/trace_waits.py DIR [STEPS]

Reads DIR/trace_rank<r>.json(.gz) of every rank and prints, per rank and profiled step:
the GPU time in communication kernels (ours and NCCL's; their time includes spinning while
the peer has not arrived), in all other kernels, and the GPU idle time (no kernel running).
For our dispatcher it also prints each gap between a combine receive and the next dispatch
send: its length and how much of it had a kernel running (a gap much longer than its kernels
is a GPU waiting for its host). STEPS: profiled steps in the capture (default 3).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from moe_backend.training.profiling import union_us


def kernels(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    out = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted(out, key=lambda e: e["ts"])


def busy_us(events: list[dict]) -> float:
    return union_us((e["ts"], e["ts"] + e["dur"]) for e in events)


def is_comm(name: str) -> bool:
    return "moe::" in name or "nccl" in name


def main() -> None:
    folder = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    paths = sorted(folder.glob("trace_rank*.json*"))
    if not paths:
        raise SystemExit(f"no trace_rank*.json(.gz) in {folder}")
    for path in paths:
        ev = kernels(path)
        span = ev[-1]["ts"] + ev[-1]["dur"] - ev[0]["ts"]
        comm = sum(e["dur"] for e in ev if is_comm(e["name"]))
        other = sum(e["dur"] for e in ev if not is_comm(e["name"]))
        idle = span - busy_us(ev)
        print(f"{path.name}: per step {span / steps / 1e3:.1f} ms: communication kernels {comm / steps / 1e3:.1f} ms, "
              f"other kernels {other / steps / 1e3:.1f} ms, GPU idle {idle / steps / 1e3:.1f} ms")
        recv = [e for e in ev if "moe::combine_recv" in e["name"]]
        send = [e for e in ev if "moe::dispatch_send" in e["name"]]
        gaps = []
        for r in recv:
            end = r["ts"] + r["dur"]
            nxt = next((s for s in send if s["ts"] >= end), None)
            if nxt is None:
                continue
            inside = [e for e in ev if end <= e["ts"] < nxt["ts"]]
            gaps.append((nxt["ts"] - end, busy_us(inside)))
        if gaps:
            short = [g for g in gaps if g[0] < 10_000]  # within a step (not the optimizer/step boundary)
            span_ms = sum(g[0] for g in short) / len(short) / 1e3
            busy_ms = sum(g[1] for g in short) / len(short) / 1e3
            print(f"  combine receive -> next dispatch send: {len(short)} gaps, mean {span_ms:.2f} ms, "
                  f"of which kernels {busy_ms:.2f} ms")


if __name__ == "__main__":
    main()
