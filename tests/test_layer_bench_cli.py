"""`moe-backend layer-bench` on CPU: the parser, `--help`, and the report helpers (no processes)."""

from __future__ import annotations

import subprocess
import sys

from moe_backend import layer_bench
from moe_backend.cli import build_parser


def test_parser_defaults_and_overrides() -> None:
    args = build_parser().parse_args(["layer-bench"])
    assert args.fn is layer_bench.cmd_layer_bench
    assert args.shapes == ["deepseek", "mixtral"] and args.dispatchers == list(layer_bench.DISPATCHERS)
    assert args.world_size == 2 and args.warmup is None and args.iters is None and not args.quick
    assert args.out == "out/layer_bench.json" and args.experts == "auto" and args.routing == "balanced"
    args = build_parser().parse_args(["layer-bench", "--quick", "--shapes", "mixtral", "--dispatchers", "nvshmem",
                                      "alltoall", "--tokens", "512", "--mixtral-ffn", "4096", "--iters", "3"])
    assert args.quick and args.shapes == ["mixtral"] and args.dispatchers == ["nvshmem", "alltoall"]
    assert args.tokens == 512 and args.mixtral_ffn == 4096 and args.iters == 3 and args.deepseek_ffn is None


def test_shapes_match_the_issue() -> None:
    ds, mx = layer_bench.SHAPES["deepseek"], layer_bench.SHAPES["mixtral"]
    assert (ds.hidden, ds.num_experts, ds.topk, ds.tokens) == (7168, 256, 8, 4096)
    assert (mx.hidden, mx.num_experts, mx.topk, mx.tokens) == (4096, 8, 2, 4096)


def test_help_lists_the_subcommand_and_its_options() -> None:
    top = subprocess.run([sys.executable, "-m", "moe_backend.cli", "--help"], capture_output=True, text=True)
    assert top.returncode == 0 and "layer-bench" in top.stdout
    res = subprocess.run([sys.executable, "-m", "moe_backend.cli", "layer-bench", "--help"], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    for flag in ("--quick", "--shapes", "--dispatchers", "--out", "--deepseek-ffn", "--mixtral-ffn"):
        assert flag in res.stdout


def _ok(total: float, disp: float, comb: float) -> dict:
    def s(m: float) -> dict:
        return {"p10": 0.9 * m, "median": m, "p90": 1.1 * m}

    ms = {"fwd": s(total * 0.4), "bwd": s(total * 0.6), "fwd_bwd": s(total),
          "dispatch_fwd": s(disp / 2), "dispatch_bwd": s(disp / 2), "combine_fwd": s(comb / 2),
          "combine_bwd": s(comb / 2), "dispatch_comm_fwd": s(disp / 4), "combine_comm_fwd": s(comb / 4)}
    return {"status": "ok", "ms": ms, "shares": layer_bench.shares(ms), "check": {"out": {"rel_l2": 1e-3}}}


def test_ratios_criterion_and_table_from_synthetic_records() -> None:
    dispatchers = {"alltoall": _ok(10.0, 2.0, 2.0), "nvshmem": _ok(8.0, 0.5, 0.5),
                   "reference": _ok(12.0, 4.0, 3.0),
                   "allgather": {"status": "error", "error": "RuntimeError: boom\nmore", "traceback": "..."},
                   "flex": {"status": "skipped", "reason": "needs DeepEP or HybridEP (neither imports)"}}
    assert abs(dispatchers["alltoall"]["shares"]["dispatch_combine_share_fwd_bwd"] - 0.4) < 1e-12
    vs = layer_bench.ratios(dispatchers)
    assert set(vs) == {"nvshmem", "reference"}
    assert vs["nvshmem"]["no_slower_than_alltoall"] and vs["nvshmem"]["share_smaller_than_alltoall"]
    assert abs(vs["nvshmem"]["time_ratio"] - 0.8) < 1e-12 and not vs["reference"]["no_slower_than_alltoall"]
    config = {"hidden": 7168, "num_experts": 256, "topk": 8, "ffn": 512, "tokens": 4096, "ep": 2,
              "experts": "sequential"}
    entry = {"shape": "deepseek", "config": config, "dispatchers": dispatchers, "vs_alltoall": vs}
    crit = layer_bench.done_criterion({"results": [entry, {**entry, "shape": "mixtral"}]})
    assert crit["nvshmem"]["met"] and not crit["reference"]["met"]
    table = layer_bench.format_table(entry)
    assert "== deepseek:" in table and "0.800x" in table and "boom" in table and "skipped" in table
    assert layer_bench.ratios({"nvshmem": dispatchers["nvshmem"]}) == {}


def test_quick_run_on_cpu_writes_a_checked_report(tmp_path) -> None:
    """`layer-bench --cpu --quick` end to end (the only run of the command without GPUs): the
    reference dispatcher is timed, the others are recorded as skipped with their reason."""
    import json
    import subprocess
    import sys

    out = tmp_path / "lb.json"
    run = subprocess.run([sys.executable, "-m", "moe_backend.cli", "layer-bench", "--cpu", "--quick", "--shapes",
                          "mixtral", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (entry,) = json.loads(out.read_text())["results"]
    ours = entry["dispatchers"]["reference"]
    assert ours["status"] == "ok" and ours["dispatcher_class"] == "MoEBackendTokenDispatcher"
    for name in ("fwd", "bwd", "fwd_bwd", "dispatch_fwd", "combine_fwd", "dispatch_bwd", "combine_bwd"):
        s = ours["ms"][name]
        assert 0 < s["p10"] <= s["median"] <= s["p90"], (name, s)
    assert ours["ms"]["dispatch_fwd"]["median"] < ours["ms"]["fwd_bwd"]["median"]
    assert 0 < ours["shares"]["dispatch_combine_share_fwd_bwd"] < 1
    for name in ("nvshmem", "alltoall", "allgather", "flex"):
        skipped = entry["dispatchers"][name]
        assert skipped["status"] == "skipped" and "CUDA" in skipped["reason"], (name, skipped)
