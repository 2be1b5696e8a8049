"""End-to-end training on CPU (2 gloo processes, reference dispatcher), the step-time
benchmark's bookkeeping, and the Slurm launcher's NVSHMEM presets."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_backend.training import bench, timing
from moe_backend.training.profiling import union_us

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "moe_backend.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_tiny_trains_on_cpu_with_reference(tmp_path: Path) -> None:
    run = _cli("train", "--config", "tiny", "--out", str(tmp_path), "--profile", str(tmp_path / "prof"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for rank in (0, 1):  # --profile: three steps after the warm-up, our autograd ops ranked
        text = (tmp_path / "prof" / f"profile_rank{rank}.txt").read_text()
        assert text.startswith("profiled steps: 3;") and "_DispatchSend" in text, text[:500]
        assert json.loads((tmp_path / "prof" / f"trace_rank{rank}.json").read_text())["traceEvents"]
    result = json.loads((tmp_path / "train_log.json").read_text())
    assert result["dispatcher"] == "reference"  # `auto` on CPU
    steps = result["steps"]
    assert len(steps) == 40
    losses = [s["loss"] for s in steps]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.75 * first, f"loss did not decrease enough: {first:.3f} -> {last:.3f}"
    for s in steps:
        assert s["time_s"] > 0 and s["tokens_per_s"] > 0
        assert s["dispatch_fwd_ms"] > 0 and s["combine_fwd_ms"] > 0  # both phases were timed
        assert s["dispatch_bwd_ms"] > 0 and s["combine_bwd_ms"] > 0
        assert s["dispatch_ms"] < s["time_s"] * 1e3
        assert 0.5 < s["aux_loss"] < 2.0  # load-balancing loss is ~1 when balanced
    rows = list(csv.DictReader((tmp_path / "train_log.csv").open()))
    assert len(rows) == 40 and float(rows[-1]["loss"]) == pytest.approx(losses[-1])
    assert "step   40/40" in run.stdout and "done tiny (reference)" in run.stdout


def test_top1_routing_takes_the_softmax_first_and_trains(tmp_path: Path) -> None:
    """topk 1 (Switch): the softmax must precede the top-1, or every weight is 1.0 and the
    router gets no gradient (megatron-core refuses that combination); only then."""
    import yaml

    from moe_backend.train_config import load_train, resolve_train_config
    from moe_backend.training.model import transformer_config

    cfg = load_train(resolve_train_config("tiny"))
    for topk, score, pre in ((1, "softmax", True), (2, "softmax", False), (1, "sigmoid", False)):
        cfg.model.topk, cfg.model.router_score_function = topk, score
        assert transformer_config(cfg, "alltoall").moe_router_pre_softmax is pre, (topk, score)

    cfg = yaml.safe_load((ROOT / "configs" / "train" / "tiny.yaml").read_text())
    cfg["model"]["topk"] = 1
    path = tmp_path / "top1.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = _cli("train", "--config", str(path), "--steps", "12", "--out", str(tmp_path / "out"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    steps = json.loads((tmp_path / "out" / "train_log.json").read_text())["steps"]
    assert steps[-1]["loss"] < steps[0]["loss"]


def test_bad_config_exits_with_explanation(tmp_path: Path) -> None:
    run = _cli("train", "--config", "tiny", "--world-size", "3", timeout=120)
    assert run.returncode == 2
    assert "parallel.ep: world_size=3 is not divisible by ep*expert_tp=2" in run.stderr, run.stderr


def test_union_us_counts_overlapping_intervals_once() -> None:
    assert union_us([(5, 6), (0, 2), (1, 3)]) == 4  # unsorted, overlapping, disjoint
    assert union_us([(1, 5), (2, 3)]) == 4  # nested
    assert union_us([]) == 0


def test_profile_device_only_needs_profile_dir() -> None:
    run = _cli("train", "--config", "tiny", "--profile-device-only", timeout=120)
    assert run.returncode != 0 and "--profile-device-only needs --profile DIR" in run.stderr


def test_train_bench_on_cpu_writes_table_json_png(tmp_path: Path) -> None:
    run = _cli("train-bench", "--config", "tiny", "--steps", "6", "--out", str(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert list(result["runs"]) == ["reference"]
    assert result["agreement"]["reference"]["agrees"]  # with itself, on CPU: not the real check below
    # The bench trains what `train` trains: same config and seed, the same loss curve exactly.
    plain = _cli("train", "--config", "tiny", "--steps", "6", "--out", str(tmp_path / "train"))
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    want = [s["loss"] for s in json.loads((tmp_path / "train" / "train_log.json").read_text())["steps"]]
    assert [s["loss"] for s in result["runs"]["reference"]["steps"]] == want
    assert set(result["skipped"]) == {"nvshmem", "alltoall", "allgather", "flex"}  # need CUDA
    table = (tmp_path / "table.txt").read_text()
    assert "reference" in table and "skipped: needs CUDA" in table
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert result["png"] is None and "matplotlib" in result["png_missing_because"]
    else:
        assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_bench_schedules_agree_on_cpu(tmp_path: Path) -> None:
    """The interleaved schedule (the default) trains exactly what the sequential one does."""
    curves = {}
    for schedule in ("interleaved", "sequential"):
        out = tmp_path / schedule
        run = _cli("train-bench", "--config", "tiny", "--steps", "6", "--schedule", schedule, "--out", str(out))
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        result = json.loads((out / "bench.json").read_text())
        assert result["schedule"] == schedule
        curves[schedule] = [s["loss"] for s in result["runs"]["reference"]["steps"]]
    assert len(curves["interleaved"]) == 6 and curves["interleaved"] == curves["sequential"]


class _FakeTrainer:
    """Stands in for loop.RankTrainer: records the order of steps; "bad" fails at step 2."""

    calls: list[tuple[str, int]] = []

    def __init__(self, cfg, device, show=True):
        self.name = cfg.dispatcher

    def step(self, step: int) -> dict:
        if self.name == "bad" and step == 1:
            raise RuntimeError("boom")
        _FakeTrainer.calls.append((self.name, step))
        return {"time_s": 0.001, "loss": 1.0}

    def finish(self, out_dir):
        return {"dispatcher": self.name, "summary": {"median_step_ms": 1.0}, "steps": []}


def test_interleaved_schedule_takes_turns_and_survives_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from moe_backend.train_config import load_train, resolve_train_config
    from moe_backend.training import loop

    monkeypatch.setattr(loop, "RankTrainer", _FakeTrainer)
    monkeypatch.setattr(loop, "prepare_rank", lambda cfg: "cpu")
    monkeypatch.setattr(loop, "model_parallel", lambda cfg: contextlib.nullcontext())
    monkeypatch.setattr(bench.dist, "get_rank", lambda: 0)
    monkeypatch.setattr(bench.report, "say", lambda text: None)
    monkeypatch.setattr(bench.report, "summary_line", lambda result: "")
    cfg = load_train(resolve_train_config("tiny"))
    cfg.train.steps = 3
    _FakeTrainer.calls = []
    runs = bench._interleaved(cfg, ["a", "bad", "c"], "unused")
    assert _FakeTrainer.calls == [("a", 0), ("bad", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2), ("c", 2)]
    assert list(runs) == ["a", "bad", "c"]  # the requested order: the first is the loss baseline
    assert "RuntimeError: boom" in runs["bad"]["error"] and runs["a"]["dispatcher"] == "a"


def _run(losses: list[float]) -> dict:
    steps = [{"step": i + 1, "loss": v} for i, v in enumerate(losses)]
    summary = {"median_step_ms": 10.0, "median_tokens_per_s": 1e5, "median_dispatch_ms": 1.0,
               "median_combine_ms": 1.0, "final_loss": losses[-1]}
    return {"steps": steps, "summary": summary}


def test_loss_agreement_flags_a_diverging_dispatcher() -> None:
    runs = {"nvshmem": _run([5.0, 4.0, 3.0]), "alltoall": _run([5.0, 4.001, 3.002]),
            "allgather": _run([5.0, 4.5, 3.0]), "flex": {"error": "ImportError: no deep_ep"}}
    agree = bench.compare_losses(runs, rtol=0.01)
    assert agree["nvshmem"]["max_rel_diff"] == 0 and agree["alltoall"]["agrees"]
    assert not agree["allgather"]["agrees"] and agree["allgather"]["max_rel_diff"] == pytest.approx(0.125)
    assert "flex" not in agree
    text = bench.table(runs, agree, {"reference": "why not"})
    assert "DISAGREES" in text and "failed: ImportError" in text and "skipped: why not" in text


def test_paired_steps_compare_the_baseline_step_by_step() -> None:
    def run(ms: list[float], timed: int) -> dict:
        return {"steps": [{"time_s": v / 1e3} for v in ms], "summary": {"timed_steps": timed}}

    runs = {"ours": run([900, 10, 11, 12, 13], 4), "theirs": run([100, 12, 12, 15, 12], 4),
            "broken": {"error": "RuntimeError: x"}}
    paired = bench.paired_steps(runs)
    assert list(paired) == ["theirs"]  # failed runs are left out; the warm-up step too
    p = paired["theirs"]
    assert p["steps"] == 4 and p["median_diff_ms"] == pytest.approx(-1.5) and p["baseline_faster_steps"] == 3
    assert p["sign_test_p"] == pytest.approx(0.625)  # 3 of 4 untied pairs: 2 * 5/16
    assert bench.sign_test_p(16, 19) == pytest.approx(2 * (1 + 19 + 171 + 969) / 2**19)
    assert bench.sign_test_p(0, 0) == 1.0 and bench.sign_test_p(5, 10) == 1.0
    assert "ours - theirs = -1.5 ms" in bench.paired_lines(paired)[0]


def test_timer_sums_spans_per_kind() -> None:
    import torch

    t = timing.CommTimer(torch.device("cpu"))
    t.add("dispatch_fwd", 1.0, 1.5)
    t.add("dispatch_fwd", 2.0, 2.25)
    t.add("combine_bwd", 0.0, 0.1)
    got = t.collect()
    assert got["dispatch_fwd"] == pytest.approx(0.75) and got["combine_bwd"] == pytest.approx(0.1)
    assert t.collect()["dispatch_fwd"] == 0.0  # cleared


@pytest.mark.parametrize("preset, expected", [
    ("nvlink", {"NVSHMEM_REMOTE_TRANSPORT": "none"}),
    ("ib", {"NVSHMEM_REMOTE_TRANSPORT": "ibrc", "NVSHMEM_IB_ENABLE_IBGDA": "0"}),
    ("ibgda", {"NVSHMEM_REMOTE_TRANSPORT": "ibgda", "NVSHMEM_IB_ENABLE_IBGDA": "1"}),
    ("efa", {"NVSHMEM_REMOTE_TRANSPORT": "libfabric", "NVSHMEM_LIBFABRIC_PROVIDER": "efa"}),
])
def test_nvshmem_presets(preset: str, expected: dict[str, str]) -> None:
    script = ROOT / "scripts" / "slurm" / "nvshmem_env.sh"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVSHMEM_", "FI_"))}
    out = subprocess.run(["bash", "-c", f"source {script} {preset} && env"], capture_output=True, text=True,
                         env=env, check=True).stdout
    got = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    for key, value in expected.items():
        assert got.get(key) == value, (key, got.get(key))
    # A site's own setting wins over the preset.
    out = subprocess.run(["bash", "-c", f"source {script} {preset} && echo $NVSHMEM_REMOTE_TRANSPORT"],
                         capture_output=True, text=True, env={**env, "NVSHMEM_REMOTE_TRANSPORT": "ucx"}).stdout
    assert out.strip() == "ucx"
    bad = subprocess.run(["bash", str(script), "bogus"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "unknown preset" in bad.stderr


def test_options_a_dispatcher_does_not_use_are_named() -> None:
    from moe_backend.train_config import DispatcherOptionsConfig
    from moe_backend.training.dispatchers import ignored_options

    opts = DispatcherOptionsConfig(transport="put", num_sms=24, check_inputs=True)
    assert ignored_options("nvshmem", opts) == []
    assert ignored_options("reference", opts) == ["transport", "num_sms"]  # check_inputs applies to ours
    assert ignored_options("alltoall", opts) == ["check_inputs", "transport", "num_sms"]
    assert ignored_options("alltoall", DispatcherOptionsConfig()) == []
