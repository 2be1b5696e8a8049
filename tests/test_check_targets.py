"""scripts/check_targets.py reads the performance targets off benchmark JSON: checked on the
committed run-22 results (measured on 2 x H200) and on small hand-written reports."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_targets.py"
RUN22 = ROOT / "results" / "gpu" / "2026-12-01-run22"

spec = importlib.util.spec_from_file_location("check_targets", SCRIPT)
check_targets = importlib.util.module_from_spec(spec)
sys.modules["check_targets"] = check_targets  # its dataclass looks its module up there
spec.loader.exec_module(check_targets)


def _row(backend: str, tokens: int, dispatch: float, combine: float, **extra) -> dict:
    phases = {"dispatch": {"median": dispatch}, "combine": {"median": combine}}
    return {"backend": backend, "num_tokens": tokens, "phases": phases, **extra}


def _report(world: int, *presets: tuple[str, list[dict]]) -> dict:
    return {"machine": {"world_size": world},
            "results": [{"preset": p, "rows": rows, "config": {}} for p, rows in presets]}


def test_run22_prefill_and_decode_as_the_readme_reports() -> None:
    checks = check_targets.checks_for(json.loads((RUN22 / "call4/run22/bench.json").read_text()), "run22")
    by = {c.target: c for c in checks}
    combine, dispatch = by["prefill 4096 combine (us)"], by["prefill 4096 dispatch (us)"]
    assert combine.met and combine.measured == pytest.approx(222.1, abs=0.1)
    assert not dispatch.met and dispatch.measured == pytest.approx(234.2, abs=0.1)
    assert not by["decode 128 token(s) dispatch (us)"].met
    # Bounds from the same run: the two-launch flag exchange (8.9 us) for decode; for prefill the
    # 58.6 MB across the link at the measured 393 GB/s copy rate (149 us), above the row traffic.
    assert by["decode 1 token(s) dispatch (us)"].bound == pytest.approx(8.896, abs=0.001)
    assert dispatch.bound == pytest.approx(58605568 / 393.37e3, abs=0.05) and not dispatch.out_of_reach
    # 24 SMs kept 234.2 / 387.1 of the dispatch's speed; writing the 470 MB of rows at the 1428 GB/s
    # the run measured for 24 SMs takes 329 us, so at most 234.2 / 329 could be kept: out of reach.
    few = by["prefill 4096 dispatch, 24 SMs: speed kept"]
    assert few.measured == pytest.approx(234.2 / 387.1, abs=0.002)
    rows = 4096 * 2 * 8 / 2 * 7168 * 2
    assert few.bound == pytest.approx(234.2 / (rows / 1428.27e3), abs=0.002) and few.out_of_reach
    # The 24-SM combine reads those rows at 2892 GB/s (162 us) and stores its 58.6 MB of partials
    # across at 343 GB/s (171 us), which may overlap: 222.1 / 171 = 1.3 could be kept, so 0.8 is
    # within reach (the run kept 0.37).
    comb = by["prefill 4096 combine, 24 SMs: speed kept"]
    assert comb.bound == pytest.approx(222.128 / (58605568 / 342.98e3), abs=0.002) and not comb.out_of_reach
    assert not comb.met
    assert by["deepseek-decode 128 dispatch: put / nvlink"].met


def test_limits_are_inclusive_and_every_put_row_is_paired() -> None:
    report = _report(2, ("deepseek-decode", [
        _row("nvshmem-nvlink", 128, 15.0, 22.0), _row("nvshmem-put", 128, 19.5, 22.0),
        _row("nvshmem-nvlink", 1, 10.0, 10.1), _row("nvshmem-put", 1, 13.1, 10.1),
        _row("nvshmem-put", 32, 20.0, 20.0),  # no nvlink row at 32: no ratio
    ]))
    got = {c.target: (c.measured, c.met) for c in check_targets.checks_for(report, "x")}
    assert got["decode 128 token(s) dispatch (us)"] == (15.0, True)
    assert got["decode 1 token(s) combine (us)"] == (10.1, False)
    assert got["deepseek-decode 128 dispatch: put / nvlink"] == (1.3, True)
    assert got["deepseek-decode 1 dispatch: put / nvlink"] == (1.31, False)
    assert not any("32" in t for t in got)


def test_fused_dispatch_is_bounded_by_one_launch() -> None:
    """A bench that times the whole op apart from its split phases (round 35 on) may have fused
    the dispatch into one launch: the one-launch floor bounds it; the combine keeps two."""
    row = _row("nvshmem-nvlink", 1, 10.6, 9.6)
    floors = {"1_launch": {"median": 7.7}, "2_launches": {"median": 8.9}}
    report = _report(2, ("deepseek-decode", [row]))
    report["results"][0]["latency_floor_us"] = floors
    bounds = lambda: {c.target: c.bound for c in check_targets.checks_for(report, "x")}  # noqa: E731
    assert bounds()["decode 1 token(s) dispatch (us)"] == 8.9  # split phases only: two launches
    row["phases"] |= {"dispatch_split": {"median": 11.4}, "combine_split": {"median": 9.5}}
    got = bounds()
    assert got["decode 1 token(s) dispatch (us)"] == 7.7 and got["decode 1 token(s) combine (us)"] == 8.9


def test_padded_layout_rows_are_checked_beside_the_contiguous_ones() -> None:
    """A decode row with the padded phases gets the same limits on them, bounded by one launch."""
    row = _row("nvshmem-nvlink", 1, 11.9, 10.6)
    row["phases"] |= {"dispatch_padded": {"median": 9.8}, "combine_padded": {"median": 10.2}}
    report = _report(2, ("deepseek-decode", [row, _row("nvshmem-nvlink", 128, 16.2, 20.4)]))
    report["results"][0]["latency_floor_us"] = {"1_launch": {"median": 7.8}, "2_launches": {"median": 8.8}}
    by = {c.target: c for c in check_targets.checks_for(report, "x")}
    dispatch = by["decode 1 token(s) dispatch, padded layout (us)"]
    combine = by["decode 1 token(s) combine, padded layout (us)"]
    assert (dispatch.measured, dispatch.met, dispatch.bound) == (9.8, True, 7.8)
    assert (combine.measured, combine.met, combine.bound) == (10.2, False, 7.8)
    assert not by["decode 1 token(s) dispatch (us)"].met
    assert not any("padded" in t and "128" in t for t in by)  # the 128-token row has no padded phases


def test_overlap_rows_are_checked() -> None:
    overlap = {"ratio": 1.2}
    report = _report(2, ("deepseek-sweep", [_row("nvshmem-nvlink", 64, 20, 20, overlap=overlap),
                                            _row("reference", 64, 900, 900, overlap={"ratio": 1.0})]))
    (check,) = check_targets.checks_for(report, "x")
    assert check.target == "deepseek-sweep 64 nvshmem-nvlink: overlap / longer alone" and not check.met


def test_command_line(tmp_path: Path) -> None:
    one = tmp_path / "ws1.json"
    one.write_text(json.dumps(_report(1, ("deepseek-prefill", [_row("nvshmem-nvlink", 4096, 168, 190)]))))
    out = tmp_path / "checks.json"
    res = subprocess.run([sys.executable, str(SCRIPT), str(RUN22 / "call6/decode.json"), str(one), "--json", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "ws1.json: skipped, world size 1" in res.stdout
    assert "NOT met  decode 128 token(s) dispatch (us)" in res.stdout
    assert any(c["target"] == "decode 128 token(s) combine (us)" and c["met"] for c in json.loads(out.read_text()))
    res = subprocess.run([sys.executable, str(SCRIPT), str(one)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "no file has a row that any target needs" in res.stderr
    res = subprocess.run([sys.executable, str(SCRIPT), str(ROOT / "README.md")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "not a benchmark JSON" in res.stderr
