"""Where a kernel's instructions and stalls go, from an `ncu` source-page export.

Reads the CSV of `ncu --import REP --page source --csv --print-source sass` (one row per SASS
instruction: executions, stall samples per reason) and prints:
1. the instructions grouped by how often each ran: a loop body shows up as a group of many
   instructions with one count (e.g. 4096 tokens x 14 steps x 2 row batches = 114,688 runs of
   a task body), so the groups say which loop level holds the instructions;
2. the stall reasons summed over the kernel;
3. the instructions that hold the most stall samples, with their main reason;
4. the barrier waits: each `BAR.SYNC` with the `stall_barrier` samples of the instructions
   after it, up to the next one (a warp waiting at a barrier is sampled at the instruction it
   will issue next): which step of the kernel the other warps wait for. With the kernel's
   duration and warp count, a sample is converted into warp-time;
5. with --runs, the stretches of consecutive instructions the kernel ran, in address order:
   their start and end (bytes from the kernel's first instruction), instructions, the most
   warps that ran any of them, their `stall_no_inst` samples (waiting for an instruction), and
   the gap jumped over to reach them. On a kernel's first pass each jump of 1 KB or more costs
   its warp ~0.15-0.2 us (scripts/step_costs.py, jumps_*), so the stretches a warp's path
   crosses tell what its instruction fetches cost (docs/PERF_NOTES.md, round 42);
6. with --split, the loops run by split warps: stretches whose instructions ran many times with
   at most --split-threads threads on average (a warp whose lanes left a branch in two groups
   runs the code after it twice, each group on its own, until a point the compiler made them
   meet: run 42 found the fused combine's receive loop run by lane 0 and lanes 1-31 apart in a
   build with __grid_constant__ parameters, twice the warp instructions). Code that only some
   lanes take on purpose shows up too; the loops are the ones to read.

An export of several launches of one kernel (`ncu -k NAME --launch-count N`) is read by its first
launch, or with --launches by every launch's counts summed (a kernel of a few microseconds gives
too few stall samples in one launch for the instructions to be told apart).

    python3 scripts/ncu_groups.py KERNEL_sass.csv[.gz] [--groups 12] [--top 20] [--launches]
                                  [--duration-us US --warps N] [--runs] [--split]
"""
from __future__ import annotations

import argparse
import csv
import gzip
import re
from collections import Counter
from pathlib import Path

# The source page's columns that are not counts (kept from the first launch by --launches); the
# "Avg." columns are averaged over the launches, every other column summed.
TEXT_COLUMNS = frozenset({"Address", "Source", "Address Space", "Access Operation", "Access Size"})
BARRIER = re.compile(r"(?<![A-Z.])BAR\.(SYNC|RED|ARV)")  # not MEMBAR / ERRBAR


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_launches(path: Path) -> tuple[list[str], list[list[list[str]]]]:
    """(header, each launch's rows) of the export: an export of several launches repeats a
    kernel-name line and the header before each launch's rows. The device machine's ncu
    (`--page source --csv`) prints each launch's table twice in a row (run 55 call 1: 40 tables
    for 20 launches, in identical pairs), so a table the same as the one before it is that launch
    again and is dropped (two launches' sampled counts are not all equal)."""
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
        rows = list(csv.reader(f))
    starts = [i for i, r in enumerate(rows) if "Address" in r and "Instructions Executed" in r]
    if not starts:
        raise SystemExit(f"{path}: no header with 'Address' and 'Instructions Executed' (not an ncu source CSV?)")
    header = rows[starts[0]]
    launches = []
    for start in starts:
        body = rows[start + 1:]
        end = next((i for i, r in enumerate(body) if len(r) < len(header)), len(body))
        if not launches or body[:end] != launches[-1]:
            launches.append(body[:end])
    return header, launches


def read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the export's first launch."""
    header, launches = read_launches(path)
    return header, launches[0]


def sum_launches(header: list[str], launches: list[list[list[str]]]) -> list[list[str]]:
    """One table of every launch's counts summed instruction by instruction (the first launch's
    addresses and text): a short kernel's stall samples are few in one launch. The launches must
    be of one kernel (the same instructions in the same order)."""
    first = launches[0]
    src = header.index("Source")
    for n, rows in enumerate(launches[1:], 2):
        if [r[src] for r in rows] != [r[src] for r in first]:
            raise SystemExit(f"launch {n} is not the first launch's kernel (its instructions differ): "
                             "export one kernel's launches (ncu -k)")
    out = [list(r) for r in first]
    for c, name in enumerate(header):
        if name in TEXT_COLUMNS:
            continue
        scale = 1 / len(launches) if "Avg." in name else 1.0
        for i, row in enumerate(out):
            v = scale * sum(_num(rows[i][c]) for rows in launches)
            row[c] = str(int(v)) if v.is_integer() else repr(v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--groups", type=int, default=12, help="execution-count groups to print (largest first)")
    ap.add_argument("--top", type=int, default=20, help="instructions with the most stall samples to print")
    ap.add_argument("--duration-us", type=float, help="the kernel's duration (ncu's Duration), for warp-time")
    ap.add_argument("--warps", type=int, help="the kernel's warps (grid x block / 32), for warp-time")
    ap.add_argument("--runs", action="store_true", help="print the stretches of code the kernel ran")
    ap.add_argument("--split", action="store_true", help="print the stretches most run by partial warps")
    ap.add_argument("--launches", action="store_true",
                    help="sum the counts of every launch in the export (default: the first launch's)")
    ap.add_argument("--split-threads", type=float, default=24.0,
                    help="--split: a stretch whose average threads a run is at most this counts (default 24)")
    args = ap.parse_args()
    header, launches = read_launches(args.csv)
    rows = sum_launches(header, launches) if args.launches else launches[0]
    if len(launches) > 1:
        print(f"{len(launches)} launches in the export; " + ("their counts summed" if args.launches else
                                                           "the first one's counts (--launches sums them)"))
    col = {name: i for i, name in enumerate(header)}
    executed = col["Instructions Executed"]
    samples = col.get("Warp Stall Sampling (All Samples)")
    reasons = [i for i, name in enumerate(header) if name.startswith("stall_") and "Not Issued" not in name]

    total = sum(_num(r[executed]) for r in rows)
    by_count: Counter[float] = Counter(_num(r[executed]) for r in rows)
    print(f"{total / 1e6:.2f}M warp instructions executed, {len(rows)} instructions in the kernel")
    print("runs each x instructions = total")
    for count, n in sorted(by_count.items(), key=lambda kv: -kv[0] * kv[1])[: args.groups]:
        print(f"  {count:>12,.0f} x {n:5d} = {count * n / 1e6:7.2f}M")

    if args.split:
        print_split(split_stretches(rows, col, args.split_threads), total)
    if samples is None or not reasons:
        return
    stall_sum = {header[i]: sum(_num(r[i]) for r in rows) for i in reasons}
    all_samples = sum(stall_sum.values()) or 1.0
    print("stall reasons (share of all samples)")
    for name, v in sorted(stall_sum.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {name:<28} {100 * v / all_samples:5.1f}%")
    print("instructions holding the most samples: samples (share), runs, main reason, source")
    for r in sorted(rows, key=lambda r: -_num(r[samples]))[: args.top]:
        main_reason = header[max(reasons, key=lambda i: _num(r[i]))]
        print(f"  {_num(r[samples]):6.0f} ({100 * _num(r[samples]) / all_samples:4.1f}%) {_num(r[executed]):>10,.0f}"
              f"  {main_reason:<24} {r[col['Source']].strip()[:60]}")
    if "stall_barrier" in col:
        per_sample = args.duration_us * args.warps / all_samples if args.duration_us and args.warps else None
        print_barrier_waits(rows, col, all_samples, per_sample)
    if args.runs:
        print_code_runs(code_runs(rows, col))


def barrier_waits(rows: list[list[str]], col: dict[str, int]) -> list[tuple[int, list[str], float]]:
    """(index, row, stall_barrier samples up to the next barrier) of each barrier instruction."""
    out: list[tuple[int, list[str], float]] = []
    for i, r in enumerate(rows):
        if BARRIER.search(r[col["Source"]]):
            out.append((i, r, 0.0))
        elif out:
            j, br, s = out[-1]
            out[-1] = (j, br, s + _num(r[col["stall_barrier"]]))
    return out


def print_barrier_waits(rows: list[list[str]], col: dict[str, int], all_samples: float,
                        per_sample: float | None) -> None:
    unit = f"; warp-us at {per_sample:.2f} a sample" if per_sample else ""
    print(f"barrier waits: instruction, runs, stall_barrier samples after it (share){unit}")
    for i, r, s in barrier_waits(rows, col):
        if s:
            us = f"  {s * per_sample:8.1f} warp-us" if per_sample else ""
            runs, src = _num(r[col["Instructions Executed"]]), r[col["Source"]].strip()[:40]
            print(f"  #{i:<6} {runs:>10,.0f}  {s:6.0f} ({100 * s / all_samples:4.1f}%){us}  {src}")


def code_runs(rows: list[list[str]], col: dict[str, int]) -> list[dict[str, int]]:
    """The stretches of consecutive executed instructions (SASS instructions are 16 bytes), in
    address order: start and end byte offsets from the kernel's first instruction, instructions,
    the most executions of any of them (warps, where each warp runs the stretch once), their
    stall_no_inst samples, and the bytes skipped since the previous stretch's end."""
    if not rows:
        return []
    base = int(rows[0][col["Address"]], 16)
    no_inst = col.get("stall_no_inst")
    runs: list[dict[str, int]] = []
    for r in rows:
        ran = _num(r[col["Instructions Executed"]])
        if not ran:
            continue
        at = int(r[col["Address"]], 16) - base
        ni = int(_num(r[no_inst])) if no_inst is not None else 0
        if runs and at == runs[-1]["end"] + 16:
            run = runs[-1]
            run.update(end=at, instructions=run["instructions"] + 1, warps=max(run["warps"], int(ran)),
                       no_inst=run["no_inst"] + ni)
        else:
            gap = at - runs[-1]["end"] - 16 if runs else 0
            runs.append({"start": at, "end": at, "instructions": 1, "warps": int(ran), "no_inst": ni, "gap": gap})
    return runs


def print_code_runs(runs: list[dict[str, int]]) -> None:
    far = sum(1 for r in runs if r["gap"] >= 1024)
    mid = sum(1 for r in runs if 256 <= r["gap"] < 1024)
    print(f"code run: {len(runs)} stretches, reached by {far} jumps of >= 1 KB and {mid} of 256 B - 1 KB")
    print("       start        end  instrs    warps  no_inst      gap")
    for r in runs:
        print(f"  {r['start']:#10x} {r['end']:#10x} {r['instructions']:7d} {r['warps']:8d} {r['no_inst']:8d}"
              f" {r['gap']:8d}")


def split_stretches(rows: list[list[str]], col: dict[str, int], max_threads: float) -> list[dict[str, float]]:
    """Stretches of consecutive instructions with one execution count and an average of at most
    max_threads threads a run: start, end (bytes from the kernel's first instruction), runs,
    instructions, average threads, and the warp instructions above what full warps would have
    issued for the same thread instructions (`extra`)."""
    threads_col = col.get("Thread Instructions Executed")
    if threads_col is None or not rows:
        raise SystemExit("--split needs the 'Thread Instructions Executed' column (ncu's SourceCounters section)")
    base = int(rows[0][col["Address"]], 16)
    out: list[dict[str, float]] = []
    for r in rows:
        ran, threads = _num(r[col["Instructions Executed"]]), _num(r[threads_col])
        if not ran or threads / ran > max_threads:
            continue
        at = int(r[col["Address"]], 16) - base
        extra = ran - threads / 32
        last = out[-1] if out else None
        if last and at == last["end"] + 16 and ran == last["runs"]:
            last.update(end=at, instructions=last["instructions"] + 1, threads=last["threads"] + threads,
                        extra=last["extra"] + extra)
        else:
            out.append({"start": at, "end": at, "runs": ran, "instructions": 1, "threads": threads, "extra": extra})
    return out


def print_split(stretches: list[dict[str, float]], total: float, top: int = 12) -> None:
    extra = sum(s["extra"] for s in stretches)
    print(f"split warps: {extra / 1e6:.2f}M warp instructions ({100 * extra / (total or 1):.1f}%) above full warps"
          " in stretches run with few threads")
    print("       start        end       runs  instrs  threads  extra")
    for s in sorted(stretches, key=lambda s: -s["extra"])[:top]:
        avg = s["threads"] / (s["runs"] * s["instructions"])
        print(f"  {int(s['start']):#10x} {int(s['end']):#10x} {s['runs']:>10,.0f} {int(s['instructions']):7d}"
              f" {avg:8.1f} {s['extra'] / 1e6:5.2f}M")


if __name__ == "__main__":
    main()
