"""`moe-backend compare`: two bench JSON files side by side, exit 1 where a median got slower."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moe_backend import cli
from moe_backend.bench_compare import BenchCompareError, compare, load_medians

RUN41 = Path(__file__).resolve().parent.parent / "results/gpu/2026-12-04-run41-single/call3"
SPEC = "E=8 top2 H=64 M=16 W=2 tp=1 bf16->bf16"


def _bench_file(path: Path, rows: dict[tuple[str, int], dict[str, float]], spec: str = SPEC) -> Path:
    """A file shaped as `moe-backend bench --out` writes it, with the given medians."""
    def phases(m: dict[str, float]) -> dict[str, dict[str, float]]:
        return {ph: {"p10": v, "median": v, "p90": v} for ph, v in m.items()}

    doc = {"machine": {"commit": "test"}, "results": [{
        "preset": "tiny", "spec": spec,
        "rows": [{"backend": b, "num_tokens": t, "phases": phases(m)} for (b, t), m in rows.items()]}]}
    path.write_text(json.dumps(doc))
    return path


def test_round_56_files_read_as_the_fused_combine_faster_and_the_reverse_as_slower(capsys) -> None:
    before, after = RUN41 / "main1.json", RUN41 / "fix1.json"
    changes = {(c.row[2], c.phase): c for c in compare(before, after).changes}
    assert changes[("nvshmem", "combine")].ratio < 0.95  # 192.0 -> 172.3 us
    assert cli.main(["compare", str(before), str(after)]) == 0
    assert cli.main(["compare", str(after), str(before)]) == 1
    out = capsys.readouterr().out
    slower = [line for line in out.splitlines() if line.endswith("SLOWER")]
    assert len(slower) == 1 and " combine " in slower[0] and "nvshmem " in slower[0]


def test_run_22_against_run_39_flags_the_prefill_combine_that_round_56_found(capsys) -> None:
    """The EP2 records before and after round 48: the gate names the two prefill combines that
    got slower (nvlink 222.1 -> 244.2 us, put 265.6 -> 281.8) and nothing else of the prefill."""
    results = RUN41.parent.parent
    old = results / "2026-12-01-run22/call4/run22/bench.json"
    new = results / "2026-12-04-run39-x2/call1/deepseek_prefill.json"
    slower = compare(old, new).slower(0.03, 1.0)
    assert sorted((c.row[2], c.phase) for c in slower) == [("nvshmem-nvlink", "combine"), ("nvshmem-put", "combine")]
    assert cli.main(["compare", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "only in the old file: deepseek-decode" in out  # run 39's file holds the prefill preset only


def test_slower_needs_both_the_fraction_and_the_microseconds(tmp_path: Path) -> None:
    old = _bench_file(tmp_path / "old.json", {("nvshmem", 1): {"dispatch": 10.0, "combine": 100.0}})
    new = _bench_file(tmp_path / "new.json", {("nvshmem", 1): {"dispatch": 10.5, "combine": 102.0}})
    cmp = compare(old, new)
    assert cmp.slower(0.03, 1.0) == []  # 5% but 0.5 us; 2 us but 2%
    assert [c.phase for c in cmp.slower(0.03, 0.2)] == ["dispatch"]
    assert [c.phase for c in cmp.slower(0.01, 1.0)] == ["combine"]
    assert cli.main(["compare", str(old), str(new), "--min-us", "0.2"]) == 1
    assert cli.main(["compare", str(old), str(new)]) == 0


def test_phases_and_rows_only_one_file_holds(tmp_path: Path, capsys) -> None:
    old = _bench_file(tmp_path / "old.json", {("nvshmem", 1): {"dispatch": 10.0, "combine_recv": 5.0},
                                              ("reference", 1): {"dispatch": 30.0}})
    new = _bench_file(tmp_path / "new.json", {("nvshmem", 1): {"dispatch": 10.0, "combine_recv": 9.0},
                                              ("nvshmem", 128): {"dispatch": 20.0}})
    cmp = compare(old, new, ("dispatch", "combine", "combine_recv"))
    assert [(c.row[2], c.phase) for c in cmp.changes] == [("nvshmem", "dispatch"), ("nvshmem", "combine_recv")]
    assert [k[2:] for k in cmp.only_old] == [("reference", 1)] and [k[2:] for k in cmp.only_new] == [("nvshmem", 128)]
    assert cli.main(["compare", str(old), str(new)]) == 0  # combine_recv is not compared by default
    assert cli.main(["compare", str(old), str(new), "--phases", "combine_recv"]) == 1
    out = capsys.readouterr().out
    assert "only in the old file: tiny" in out and "only in the new file: tiny" in out


@pytest.mark.parametrize("content, says", [
    (None, "cannot read it"),
    ("{not json", "not JSON"),
    (json.dumps({"rows": []}), "no 'results' list"),
    (json.dumps({"results": [{"preset": "tiny", "spec": SPEC, "rows": [{"backend": "nvshmem"}]}]}), "phase medians"),
])
def test_a_file_that_is_not_a_bench_result_is_refused_by_name(tmp_path: Path, capsys, content: str | None,
                                                              says: str) -> None:
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    good = _bench_file(tmp_path / "good.json", {("nvshmem", 1): {"dispatch": 1.0}})
    with pytest.raises(BenchCompareError, match=says):
        load_medians(bad)
    assert cli.main(["compare", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.json" in err and says in err


def test_files_of_other_shapes_share_no_row(tmp_path: Path) -> None:
    old = _bench_file(tmp_path / "old.json", {("nvshmem", 1): {"dispatch": 1.0}})
    new = _bench_file(tmp_path / "new.json", {("nvshmem", 1): {"dispatch": 1.0}}, spec=SPEC.replace("W=2", "W=4"))
    with pytest.raises(BenchCompareError, match="share no"):
        compare(old, new)
    assert cli.main(["compare", str(old), str(new)]) == 2


@pytest.mark.parametrize("flag, value", [("--tolerance", "-0.1"), ("--min-us", "nan"), ("--tolerance", "x")])
def test_bad_limits_are_refused_by_argparse(tmp_path: Path, flag: str, value: str) -> None:
    f = _bench_file(tmp_path / "a.json", {("nvshmem", 1): {"dispatch": 1.0}})
    with pytest.raises(SystemExit) as exc:
        cli.main(["compare", str(f), str(f), flag, value])
    assert exc.value.code == 2


RUN42 = RUN41.parent.parent / "2026-12-04-run42-single/call3/ab_decode_self"


def test_backends_leave_the_reference_rows_out(capsys) -> None:
    """Run 42 call 3 (SELF_SEND decode, `--backend all`, main against round 57): the reference
    backend's millisecond rows come out slower by chance (1274.7 -> 1448.2 us at 1 token);
    restricted to the two transports, nothing is slower and the 1-token combines are faster."""
    old, new = RUN42 / "bench_1_MOE_BACKEND_DEVSO_fromx.json", RUN42 / "bench_2_MOE_BACKEND_DEVSO_warpw.json"
    assert cli.main(["compare", str(old), str(new)]) == 1
    assert "reference" in capsys.readouterr().out
    transports = ("nvshmem-nvlink", "nvshmem-put")
    cmp = compare(old, new, backends=transports)
    assert {c.row[2] for c in cmp.changes} == set(transports) and cmp.slower(0.03, 1.0) == []
    assert all(c.ratio < 0.93 for c in cmp.changes if c.phase == "combine" and c.row[3] == 1)  # 8.6 -> 7.8, 9.0 -> 8.1
    assert cli.main(["compare", str(old), str(new), "--backends", *transports]) == 0
    out = capsys.readouterr().out
    assert "reference" not in out and "0 of 12 medians slower" in out


def test_backends_that_no_row_has_are_refused(tmp_path: Path, capsys) -> None:
    old = _bench_file(tmp_path / "old.json", {("nvshmem", 1): {"dispatch": 10.0}})
    with pytest.raises(BenchCompareError, match="no row of backend nvshmem-put in"):
        compare(old, old, backends=("nvshmem-put",))
    assert cli.main(["compare", str(old), str(old), "--backends", "nvshmem-put"]) == 2
    assert "no row of backend nvshmem-put" in capsys.readouterr().err
