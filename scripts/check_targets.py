#!/usr/bin/env python3
"""The performance targets, read off benchmark JSON as `moe-backend bench` wrote it.

    python3 scripts/check_targets.py results/gpu/RUN/bench.json [more.json ...] [--json OUT]

The targets are EP2's (two GPUs of one host): a file written at another world size is skipped.
Each target is checked in every file that has the rows it needs (nvshmem-nvlink unless it
says otherwise; medians of the slowest rank, each op as `comm.dispatch` / `comm.combine` run
it: send + receive, since round 35 possibly one fused launch):
- DeepSeek decode (fp8 + scales dispatch, bf16 combine), 128 tokens: dispatch <= 15 us,
  combine <= 22 us; 1 token: both <= 10 us. Checked for the contiguous ops and, where the file
  has them, for the padded layout's (`dispatch_padded` / `combine_padded`: per-expert slots, the
  layout DeepEP's low-latency kernels return; one launch each, bounded by the one-launch floor).
- DeepSeek prefill (bf16), 4096 tokens: dispatch <= 210 us, combine <= 230 us; with the
  kernels sized for 24 SMs (`--sms 24` rows) at least 80% of that speed. A bound comes from
  the same run: the 24-SM dispatch must write every expert row (~470 MB a rank) at no more than
  the store rate the run measured for 24 SMs, the 24-SM combine read them at its load rate and
  store its partials across the link at its NVLink store rate; the speed it can keep is at
  most full-GPU time / that least time: below 0.8 the target is out of reach.
- put within 1.3x of nvlink on every row (both ops, every preset and token count).
- overlap (the sweep preset's rows): dispatch send, an independent matmul, dispatch receive
  take at most 1.15x the longer of the two alone.
Where the run's own measurements give one, a check also carries a bound, the best those
measurements allow: the flag exchange in as many launches as the op for decode, the link
(bytes across at the copy rate) and the expert-row traffic for prefill. A target its bound
misses is out of reach.
Prints one line per check and a count of those met; `--json` writes them too. Exit code 0
whatever was met (it is a report); 2 when no file has a row any target needs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TARGET_WORLD = 2
NVLINK = "nvshmem-nvlink"
PUT = "nvshmem-put"
FEW_SMS = "nvshmem-nvlink-24sm"


@dataclass
class Check:
    target: str
    source: str
    measured: float
    limit: float
    met: bool
    # The best the same run's own measurements allow, where a bound is derived (same unit as
    # `measured`): the two-launch flag-exchange floor for decode, the link and memory time for
    # prefill, the 24-SM store rate for the 24-SM dispatch; `out_of_reach`: it misses the limit.
    bound: float | None = None
    out_of_reach: bool = False


ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


def _expert_row_bytes(preset: dict[str, Any], tokens: int, world: int) -> float:
    """Bytes of expert rows the dispatch writes per rank under uniform routing: every source
    group's tokens, topk / world of their experts on each rank (the contract's layout)."""
    comm = preset["config"]["comm"]
    groups = world // comm["tp_size"]
    return tokens * groups * comm["topk"] / world * comm["hidden"] * ELEMENT_BYTES[comm["in_dtype"]]


def _rows(report: dict[str, Any]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(preset, backend, tokens) -> row, over every preset of one file."""
    return {(p["preset"], r["backend"], r["num_tokens"]): r for p in report["results"] for r in p["rows"]}


def _median(row: dict[str, Any], op: str) -> float:
    return float(row["phases"][op]["median"])


def _at_most(target: str, source: str, value: float, limit: float, bound: float | None = None) -> Check:
    """A time or ratio that must not exceed `limit`; `bound`, if known, the least it can be."""
    reach = None if bound is None else round(bound, 3)
    return Check(target, source, round(value, 3), limit, value <= limit, reach, bound is not None and bound > limit)


def _launch_floor(preset: dict[str, Any], row: dict[str, Any], phase: str) -> float | None:
    """An op of two launches that exchange flags is bounded by the run's two-launch floor. A
    bench that times the whole op apart from its split phases (a `<op>_split` phase, since
    round 35) may have fused the dispatch into one launch: its one-launch floor bounds it. The
    padded layout's ops (`<op>_padded`) are one launch each way."""
    floor = preset.get("latency_floor_us") or {}
    one = phase.endswith("_padded") or (phase == "dispatch" and "dispatch_split" in row["phases"])
    return floor.get("1_launch" if one else "2_launches", {}).get("median")


def _prefill_floor(preset: dict[str, Any], row: dict[str, Any], world: int) -> float | None:
    """The larger of the link time (bytes across at the run's copy rate) and the time the whole
    GPU takes to write (dispatch) or read (combine) the expert rows at the run's SM rates."""
    copy, sms = preset.get("copy_rate_gbps"), (preset.get("sm_ceilings_gbps") or {})
    full = max(sms.values(), key=lambda v: v.get("sms", 0), default=None)  # the whole GPU's rates
    if not copy or not full or not row.get("bytes_across_max_rank"):
        return None
    rows = _expert_row_bytes(preset, row["num_tokens"], world)
    return {op: max(row["bytes_across_max_rank"][op] / (copy * 1e3), rows / (full[rate] * 1e3))
            for op, rate in (("dispatch", "store"), ("combine", "load"))}


def _few_sm_floor(preset: dict[str, Any], row: dict[str, Any], op: str, world: int) -> float | None:
    """The least time 24 SMs can take, at the rates the run measured for 24 SMs: the dispatch
    writes every expert row (its link bytes go by copy engine); the combine reads every expert
    row (by its fastest load form) and stores its partials across the link, which may overlap."""
    rates = (preset.get("sm_ceilings_gbps") or {}).get("24_sms", {})
    rows = _expert_row_bytes(preset, 4096, world)
    if op == "dispatch":
        return rows / (rates["store"] * 1e3) if rates.get("store") else None
    loads = [v for k, v in rates.items() if "load" in k]
    across = (row.get("bytes_across_max_rank") or {}).get("combine")
    if not loads or not rates.get("nvlink_store") or not across:
        return None
    return max(rows / (max(loads) * 1e3), across / (rates["nvlink_store"] * 1e3))


def checks_for(report: dict[str, Any], source: str) -> list[Check]:
    rows = _rows(report)
    presets = {p["preset"]: p for p in report["results"]}
    world = report["machine"]["world_size"]
    found: list[Check] = []
    for tokens, limits in ((128, {"dispatch": 15.0, "combine": 22.0}), (1, {"dispatch": 10.0, "combine": 10.0})):
        row = rows.get(("deepseek-decode", NVLINK, tokens))
        for op, limit in limits.items():
            # The contiguous op, then the padded layout's (DeepEP low-latency's output) where timed.
            for phase in (op, f"{op}_padded") if row else ():
                if phase == op or phase in row["phases"]:
                    name = f"decode {tokens} token(s) {op}{', padded layout' if phase != op else ''} (us)"
                    floor = _launch_floor(presets["deepseek-decode"], row, phase)
                    found.append(_at_most(name, source, _median(row, phase), limit, floor))
    full = rows.get(("deepseek-prefill", NVLINK, 4096))
    few = rows.get(("deepseek-prefill", FEW_SMS, 4096))
    floors = _prefill_floor(presets["deepseek-prefill"], full, world) if full else None
    for op, limit in (("dispatch", 210.0), ("combine", 230.0)):
        if full:
            found.append(_at_most(f"prefill 4096 {op} (us)", source, _median(full, op), limit, (floors or {}).get(op)))
        if full and few:
            # Speed kept with 24 SMs = full-GPU time / 24-SM time; the target is >= 0.8.
            kept = _median(full, op) / _median(few, op)
            check = Check(f"prefill 4096 {op}, 24 SMs: speed kept", source, round(kept, 3), 0.8, kept >= 0.8)
            fastest_us = _few_sm_floor(presets["deepseek-prefill"], full, op, world)
            if fastest_us:
                check.bound = round(_median(full, op) / fastest_us, 3)
                check.out_of_reach = check.bound < 0.8
            found.append(check)
    for (preset, backend, tokens), row in sorted(rows.items()):
        other = rows.get((preset, NVLINK, tokens))
        if backend != PUT or not other:
            continue
        for op in ("dispatch", "combine"):
            if op in row["phases"] and op in other["phases"]:
                ratio = _median(row, op) / _median(other, op)
                found.append(_at_most(f"{preset} {tokens} {op}: put / nvlink", source, ratio, 1.3))
    for (preset, backend, tokens), row in sorted(rows.items()):
        if backend.startswith("nvshmem") and row.get("overlap"):
            found.append(_at_most(f"{preset} {tokens} {backend}: overlap / longer alone", source,
                                  row["overlap"]["ratio"], 1.15))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="benchmark JSON written by `moe-backend bench --out`")
    parser.add_argument("--json", type=Path, help="also write the checks here")
    args = parser.parse_args(argv)
    found: list[Check] = []
    for path in args.files:
        try:
            report = json.loads(path.read_text())
            world = report["machine"]["world_size"]
            if world != TARGET_WORLD:
                print(f"check_targets: {path}: skipped, world size {world} (the targets are EP{TARGET_WORLD}'s)")
                continue
            found += checks_for(report, str(path))
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"check_targets: {path}: not a benchmark JSON ({type(err).__name__}: {err})", file=sys.stderr)
            return 2
    if not found:
        print("check_targets: no file has a row that any target needs", file=sys.stderr)
        return 2
    for c in found:
        bound = "" if c.bound is None else f"; bound {c.bound}{', out of reach' if c.out_of_reach else ''}"
        print(f"{'met    ' if c.met else 'NOT met'}  {c.target:<58} {c.measured:>9.3f}  (limit {c.limit}{bound})  "
              f"{c.source}")
    print(f"{sum(c.met for c in found)} of {len(found)} checks met")
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in found], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
