"""Two benchmark JSON files (`moe-backend bench --out`) side by side: for each row both hold
(preset, shape, backend, tokens per rank), its phases' medians, new / old, and which got slower.

A regression gate for kernel changes: a change that leaves a path it does not aim at slower
shows here (round 56 found the fused combine 19 us slower eight rounds after the change that
did it, because no routine run timed that path)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# The whole ops, what a caller waits for; the halves' medians are noisier (host-bound sends).
WHOLE_OPS = ("dispatch", "combine")

RowKey = tuple[str, str, str, int]  # preset, spec (shape and world size), backend, tokens per rank


class BenchCompareError(ValueError):
    """A file that is not a benchmark result, or two that share no row."""


@dataclass(frozen=True)
class PhaseChange:
    row: RowKey
    phase: str
    old_us: float
    new_us: float

    @property
    def ratio(self) -> float:
        return self.new_us / self.old_us

    def slower(self, tolerance: float, min_us: float) -> bool:
        """Slower by more than `tolerance` of the old median and by more than `min_us`."""
        return self.new_us - self.old_us > max(min_us, tolerance * self.old_us)


@dataclass(frozen=True)
class Comparison:
    changes: list[PhaseChange]
    only_old: list[RowKey]
    only_new: list[RowKey]

    def slower(self, tolerance: float, min_us: float) -> list[PhaseChange]:
        return [c for c in self.changes if c.slower(tolerance, min_us)]


def load_medians(path: str | Path) -> dict[RowKey, dict[str, float]]:
    """Each row's phase medians (us) from a `moe-backend bench --out` file."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as err:
        raise BenchCompareError(f"{path}: cannot read it ({err.strerror})") from err
    except json.JSONDecodeError as err:
        raise BenchCompareError(f"{path}: not JSON ({err.msg}, line {err.lineno})") from err
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list):
        raise BenchCompareError(f"{path}: no 'results' list: not a `moe-backend bench --out` file")
    rows: dict[RowKey, dict[str, float]] = {}
    for result in results:
        try:
            preset, spec = str(result["preset"]), str(result["spec"])
            for row in result["rows"]:
                key = (preset, spec, str(row["backend"]), int(row["num_tokens"]))
                rows[key] = {name: float(p["median"]) for name, p in row["phases"].items()}
        except (KeyError, TypeError, ValueError) as err:
            raise BenchCompareError(
                f"{path}: a result without preset, spec or rows of phase medians ({err!r})") from err
    return rows


def compare(old_path: str | Path, new_path: str | Path, phases: tuple[str, ...] = WHOLE_OPS,
            backends: tuple[str, ...] | None = None) -> Comparison:
    """The named phases of every row both files hold (a phase either row lacks is skipped), of
    the named backends only when `backends` is given (the reference backend's millisecond rows
    vary by tens of percent from run to run: a kernel A/B leaves them out)."""
    old, new = load_medians(old_path), load_medians(new_path)
    if backends is not None:
        old = {k: v for k, v in old.items() if k[2] in backends}
        new = {k: v for k, v in new.items() if k[2] in backends}
        if not old or not new:
            raise BenchCompareError(f"no row of backend {', '.join(backends)} in "
                                    f"{old_path if not old else new_path}")
    common = [k for k in old if k in new]
    if not common:
        raise BenchCompareError(f"{old_path} and {new_path} share no (preset, shape, backend, tokens) row")
    changes = [
        PhaseChange(k, ph, old[k][ph], new[k][ph])
        for k in common
        for ph in phases
        if ph in old[k] and ph in new[k] and old[k][ph] > 0
    ]
    return Comparison(changes, [k for k in old if k not in new], [k for k in new if k not in old])


def format_comparison(cmp: Comparison, tolerance: float, min_us: float) -> str:
    lines = [f"{'preset':18} {'backend':22} {'tokens':>6} {'phase':14} {'old us':>9} {'new us':>9} {'new/old':>7}"]
    for c in cmp.changes:
        preset, _, backend, tokens = c.row
        mark = "  SLOWER" if c.slower(tolerance, min_us) else ""
        lines.append(f"{preset:18} {backend:22} {tokens:>6} {c.phase:14} {c.old_us:9.1f} {c.new_us:9.1f} "
                     f"{c.ratio:7.3f}{mark}")
    for label, keys in (("only in the old file", cmp.only_old), ("only in the new file", cmp.only_new)):
        by_shape: dict[tuple[str, str], list[RowKey]] = {}
        for k in keys:
            by_shape.setdefault(k[:2], []).append(k)
        for (preset, spec), ks in by_shape.items():
            backends = ", ".join(dict.fromkeys(k[2] for k in ks))
            tokens = ", ".join(str(t) for t in sorted({k[3] for k in ks}))
            lines.append(f"{label}: {preset} ({spec}): {len(ks)} rows, {backends} at {tokens} tokens")
    n = len(cmp.slower(tolerance, min_us))
    lines.append(f"{n} of {len(cmp.changes)} medians slower by more than {tolerance:.0%} and {min_us:g} us")
    return "\n".join(lines)
