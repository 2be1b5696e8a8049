"""The command-line tool end to end on CPU: info, bench on every preset, selftest, errors."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_backend.bench import PHASES, padded_fits
from moe_backend.config import BenchPreset, from_dict


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moe_backend.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_info_prints_devices_backend_and_sizes() -> None:
    res = cli("info", "--config", "mixtral")
    assert res.returncode == 0, res.stderr
    assert "CUDA devices:" in res.stdout and "backend 'auto' picks:" in res.stdout
    assert "E=8 top2 H=4096" in res.stdout
    # The buffer formula, for both transports (staging exists only for put).
    assert "put transport" in res.stdout and "nvlink transport" in res.stdout
    assert re.search(r"symmetric_total\s+[\d,]+", res.stdout)
    # Mixtral's rows (4096 bf16) take the padded kernels: their region's size is printed.
    assert re.search(r"padded layout \(nvlink, at the first dispatch_padded\): [\d,]+ symmetric bytes", res.stdout)


def test_bench_every_preset_writes_table_and_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    # Few iterations and smaller prefill batches: CI checks the tool, not CPU speed.
    png = tmp_path / "bench.png"
    res = cli("bench", "--all-presets", "--backend", "reference", "--iters", "2", "--warmup", "1",
              "--num-tokens", "1", "64", "--out", str(out), "--plot", str(png))
    assert res.returncode == 0, res.stdout + res.stderr
    names = ["deepseek-decode", "deepseek-decode-each", "deepseek-prefill", "deepseek-sweep", "mixtral"]
    for name in names:
        assert f"== {name}:" in res.stdout
    report = json.loads(out.read_text())
    assert {"date", "commit", "torch", "world_size"} <= set(report["machine"])
    assert [r["preset"] for r in report["results"]] == names
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sweep = report["results"][3]
    assert sweep["config"]["bench"]["size_each"] and not report["results"][0]["config"]["bench"]["size_each"]
    assert report["results"][1]["config"]["bench"]["size_each"]  # decode, an arena per batch size
    for row in (r for r in sweep["rows"] if r["backend"] == "reference"):
        o = row["overlap"]  # the sweep preset also times dispatch around an independent matmul
        assert o["matmul_reps"] >= 1 and o["ratio"] == o["overlapped_us"] / max(o["dispatch_us"], o["matmul_us"])
    for preset in report["results"]:
        ref = [r for r in preset["rows"] if r["backend"] == "reference"]
        assert [r["num_tokens"] for r in ref] == [1, 64]
        # The padded layout's phases where its slots fit (decode sizes: not the prefill preset's).
        bench_preset = from_dict(BenchPreset, preset["config"])
        spec = bench_preset.comm.to_spec(report["machine"]["world_size"])
        padded = {"dispatch_padded", "combine_padded"}
        for row in ref:
            each = bench_preset.bench.size_each
            sized = dataclasses.replace(spec, max_num_tokens=row["num_tokens"]) if each else spec
            fits = padded_fits(sized)
            assert set(row["phases"]) == (set(PHASES) if fits else set(PHASES) - padded), preset["preset"]
            assert set(row["host_us"]) == set(PHASES[:6])  # the calls' CPU time, split and whole
            for s in row["phases"].values():
                assert 0 < s["p10"] <= s["median"] <= s["p90"]
            assert row["bytes_across_max_rank"]["dispatch"] > 0


def test_selftest_on_eight_ranks_every_tp_size() -> None:
    """EP8's rank count (issue 7's machines are not lent): the contract on 8 gloo ranks, with
    attention-TP replicas of 1, 2, 4 and 8 ranks."""
    res = cli("selftest", "--backend", "reference", "--world-size", "8", "--tp-size", "1", "2", "4", "8")
    assert res.returncode == 0, res.stdout + res.stderr
    for tp in (1, 2, 4, 8):
        assert f"tp_size {tp}: 72 contract cases passed bit for bit" in res.stdout


def test_selftest_under_torchrun_agrees_on_one_seed() -> None:
    """Under torchrun every rank parses the command line and draws a seed: the ranks must
    check rank 0's inputs (with their own seeds the contract failed on every rank)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    res = subprocess.run([str(torchrun), "--nproc-per-node", "2", "-m", "moe_backend.cli", "selftest", "--backend",
                          "reference", "--tp-size", "1"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("selftest seed") == 1  # rank 0 reports the one seed every rank used
    assert "tp_size 1: 72 contract cases passed bit for bit" in res.stdout


def test_selftest_passes_on_reference() -> None:
    res = cli("selftest", "--backend", "reference", "--world-size", "2", "--tp-size", "1", "2")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "tp_size 1: 72 contract cases passed" in res.stdout
    assert "tp_size 2: 72 contract cases passed" in res.stdout


@pytest.mark.parametrize("args, pattern", [
    (["bench", "--config", "nope"], "no config file or preset named 'nope'"),
    (["bench", "--config", "mixtral", "--num-tokens", "5000"], r"not in \[1, comm.max_num_tokens=4096\]"),
    # Counts are checked by argparse, before any process starts (0 once meant "the preset's").
    (["bench", "--world-size", "0"], "argument --world-size: must be an integer >= 1, got 0"),
    (["bench", "--sms", "48", "0"], "argument --sms: must be an integer >= 1, got 0"),
    (["bench", "--warmup", "-1"], "argument --warmup: must be an integer >= 0, got -1"),
    (["bench", "--iters", "ten"], "argument --iters: not an integer: 'ten'"),
    (["selftest", "--world-size", "0"], "argument --world-size: must be an integer >= 1"),
    # A TP size that does not divide the world size was once skipped: a selftest of nothing.
    (["selftest", "--backend", "reference", "--world-size", "3", "--tp-size", "1", "2"],
     r"--tp-size \[2\] does not divide the world size 3"),
    (["info", "--world-size", "3"], "deepseek-decode at world size 3: num_experts=256 must be divisible"),
    (["train", "--steps", "-1"], "argument --steps: must be an integer >= 1"),
    (["layer-bench", "--tokens", "0"], "argument --tokens: must be an integer >= 1"),
    (["train", "--out", __file__], r"output folder '.*test_cli.py' is an existing file"),
    (["train-bench", "--out", __file__], r"output folder '.*test_cli.py' is an existing file"),
])
def test_bad_arguments_are_reported(args: list[str], pattern: str) -> None:
    res = cli(*args)
    assert res.returncode == 2
    assert re.search(pattern, res.stderr), res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("args, pattern", [
    (["bench", "--backend", "nvshmem"], r"--backend nvshmem: unavailable here \(no CUDA device\)"),
    (["selftest", "--backend", "nvshmem"], r"--backend nvshmem: unavailable here"),
    (["train", "--dispatcher", "nvshmem", "--steps", "6"], "dispatcher: 'nvshmem' needs CUDA GPUs"),
    (["train", "--dispatcher", "allgather", "--steps", "6"], "dispatcher: 'allgather' needs CUDA GPUs"),
])
def test_gpu_only_choices_are_refused_on_cpu_before_launch(args: list[str], pattern: str) -> None:
    res = cli(*args)
    assert res.returncode == 2, res.stdout + res.stderr
    assert re.search(pattern, res.stderr), res.stderr
    assert "starting" not in res.stdout and "Traceback" not in res.stderr  # no process was started


def test_selftest_default_tp_sizes_follow_the_world_size() -> None:
    from moe_backend.cli import selftest_tp_sizes

    assert selftest_tp_sizes(None, 2) == [1, 2]
    assert selftest_tp_sizes(None, 3) == [1]
    assert selftest_tp_sizes([1, 4], 8) == [1, 4]


def test_bench_rows_with_fewer_sms(monkeypatch) -> None:
    """`bench --sms N` adds nvlink rows with the kernels sized for N SMs, where nvshmem runs."""
    from moe_backend import bench

    assert bench.backends_to_run("all", torch.device("cpu"), [24]) == [("reference", "reference", {})]
    monkeypatch.setattr(bench, "nvshmem_available", lambda device=None: (True, ""))
    rows = bench.backends_to_run("all", torch.device("cuda", 0), [24, 48])
    assert [r[0] for r in rows] == ["reference", "nvshmem-put", "nvshmem-nvlink",
                                    "nvshmem-nvlink-24sm", "nvshmem-nvlink-48sm"]
    assert rows[3][2] == {"transport": "nvlink", "num_sms": 24}
    assert [r[0] for r in bench.backends_to_run("reference", torch.device("cuda", 0), [24])] == ["reference"]


def test_table_and_plot_show_the_latency_floor_and_memory_rates(tmp_path) -> None:
    from moe_backend import bench
    from moe_backend.bench_plot import plot_latency

    phases = {op: {"p10": 20.0, "median": 22.0, "p90": 25.0} for op in ("dispatch", "combine")}
    report = {"preset": "p", "spec": "s", "copy_rate_gbps": None, "rows": [
        {"backend": "nvshmem", "num_tokens": n, "phases": phases} for n in (1, 8)],
        "latency_floor_us": {"1_launch": {"p10": 5.0, "median": 6.0, "p90": 7.0},
                             "2_launches": {"p10": 9.0, "median": 10.5, "p90": 12.0}},
        "local_memory_gbps": {"copy": 4100.4, "write": 3300.6, "replicate_x4": 2900.2},
        "sm_ceilings_gbps": {"132_sms": {"sms": 132, "load": 3900.2, "bulk_load": 3700.0, "store": 4200.0,
                                         "bulk_store": 4100.0, "nvlink_store": 350.4},
                             "24_sms": {"sms": 24, "load": 1100.0, "store": 1500.0}}}
    text = bench.format_table(report)
    assert ("probe kernel on 132 SMs (GB/s): load 3900, bulk load 3700, store 4200, bulk store 4100, "
            "nvlink store 350") in text
    assert "probe kernel on 24 SMs (GB/s): load 1100, store 1500\n" in text
    assert "latency floor (NVLink store + wait, every peer): 1 launch 6.0 us, 2 launches 10.5 us" in text
    assert ("within-GPU memory traffic (read + write): copy 4100 GB/s, write-only 3301 GB/s, "
            "each row to 4 rows 2900 GB/s") in text
    assert "within-GPU" not in bench.format_table({**report, "local_memory_gbps": None})
    png = tmp_path / "p.png"
    why = plot_latency([report], png)
    pytest.importorskip("matplotlib")  # a test extra: installed wherever the suite runs
    assert why is None and png.read_bytes()[:4] == b"\x89PNG"
    from moe_backend.bench_plot import latency_figure

    ax = latency_figure([report]).axes[0]  # the token counts measured label the x axis, nothing between
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "8"]
    assert list(ax.get_xticks(minor=True)) == []


def test_time_after_barrier_times_every_measured_call() -> None:
    """The probes' shared timing loop: warm-up calls untimed, one sample per measured call,
    ordered quantiles, on every rank (gloo: host clock)."""
    from moe_backend import launch

    launch.spawn(_time_after_barrier, 2, dist_backend="gloo", timeout=60)


def _time_after_barrier() -> None:
    import time

    import torch

    from moe_backend.bench import time_after_barrier

    calls = []
    got = time_after_barrier(torch.device("cpu"), lambda: (calls.append(1), time.sleep(0.002)), 5, 2)
    assert len(calls) == 7, calls
    assert 2000 <= got["p10"] <= got["median"] <= got["p90"] < 1e6, got


def test_machine_info_outside_a_process_group() -> None:
    """Scripts that time one GPU (scripts/overlap_room.py) record the machine with no process
    group: world size 1, no distributed backend, and a commit."""
    import torch.distributed as dist

    from moe_backend.bench import machine_info

    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    info = machine_info()
    assert info["world_size"] == 1 and info["dist_backend"] is None
    assert info["commit"] and info["date"].startswith("20")


def test_timing_outside_a_process_group() -> None:
    """One-GPU scripts time calls like the ops (`time_after_barrier`) with no process group:
    the barrier is then only the GPU sleep (nothing on the CPU), and every call is timed."""
    import time

    import torch
    import torch.distributed as dist

    from moe_backend.bench import time_after_barrier

    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    calls: list[int] = []
    got = time_after_barrier(torch.device("cpu"), lambda: (calls.append(1), time.sleep(0.002)), 4, 1)
    assert len(calls) == 5, calls
    assert 2000 <= got["p10"] <= got["median"] <= got["p90"] < 1e6, got


def test_bench_warm_inputs_is_recorded(tmp_path: Path) -> None:
    """--warm-inputs: every timed call's inputs read once before it; the table and JSON say so."""
    out = tmp_path / "warm.json"
    res = cli("bench", "--backend", "reference", "--iters", "2", "--warmup", "0", "--num-tokens", "1", "4",
              "--warm-inputs", "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"== deepseek-decode: .*; inputs warm", res.stdout)
    result = json.loads(out.read_text())["results"][0]
    assert result["config"]["bench"]["warm_inputs"] is True
    assert [r["num_tokens"] for r in result["rows"] if r["backend"] == "reference"] == [1, 4]


def test_barrier_reads_each_input_it_is_given(monkeypatch) -> None:
    from moe_backend import bench as benchmod

    read = []
    real = torch.Tensor.amax
    monkeypatch.setattr(torch.Tensor, "amax", lambda t, *a, **k: read.append(t.numel()) or real(t, *a, **k))
    x = torch.randn(3, 8).to(torch.bfloat16)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    benchmod.barrier(torch.device("cpu"), torch.ones(1), (x, None, ids, torch.empty(0)))
    assert read == []  # warm off (the default): nothing read
    benchmod.barrier(torch.device("cpu"), torch.ones(1), (x, None, ids, torch.empty(0)), warm="read")
    assert read == [3 * 8 * 2, 3 * 2 * 4]  # bytes of x and ids; None and empty skipped


def test_barrier_rewrites_each_input_in_place_when_warm_by_write(monkeypatch) -> None:
    """warm="write": each input rewritten in place (one OR of zero on its bytes, no read
    reduction), its bits unchanged; a non-contiguous input is read instead."""
    from moe_backend import bench as benchmod

    calls = []
    real_or, real_amax = torch.Tensor.bitwise_or_, torch.Tensor.amax
    monkeypatch.setattr(torch.Tensor, "bitwise_or_", lambda t, *a: calls.append(("write", t.numel())) or real_or(t, *a))
    monkeypatch.setattr(torch.Tensor, "amax",
                        lambda t, *a, **k: calls.append(("read", t.numel())) or real_amax(t, *a, **k))
    x = torch.randn(3, 8).to(torch.bfloat16)
    x[0, 0] = -0.0
    strided = torch.randn(4, 6)[:, ::2]
    before = x.clone(), strided.clone()
    benchmod.barrier(torch.device("cpu"), torch.ones(1), (x, None, strided), warm="write")
    assert calls == [("write", 3 * 8 * 2), ("read", 4 * 3 * 4)]
    assert torch.equal(x.view(torch.int16), before[0].view(torch.int16))  # -0.0 kept: bit for bit
    assert torch.equal(strided, before[1])


@pytest.mark.parametrize("warm", ["scratch", "launch", "launch-out", "fill"])
def test_barrier_reads_a_scratch_buffer_when_warm_by_a_control(monkeypatch, warm: str) -> None:
    """The controls: "scratch" reads a buffer of each input's size, "launch" one of 16 bytes for
    each input (the same number of reads), "launch-out" as launch into one output made once,
    "fill" fills one of 16 bytes as often (no read), each made once per size; the input itself
    neither read nor written."""
    from moe_backend import bench as benchmod

    read, filled, outs = [], [], []
    real_amax, real_fill, real_amax_fn = torch.Tensor.amax, torch.Tensor.fill_, torch.amax
    monkeypatch.setattr(torch.Tensor, "amax", lambda t, *a, **k: read.append(t) or real_amax(t, *a, **k))

    def amax_into(t: torch.Tensor, *a, out: torch.Tensor, **k) -> torch.Tensor:
        read.append(t)
        outs.append(out)
        return real_amax_fn(t, *a, out=out, **k)

    monkeypatch.setattr(torch, "amax", amax_into)
    monkeypatch.setattr(torch.Tensor, "fill_", lambda t, v: filled.append(t) or real_fill(t, v))
    monkeypatch.setattr(torch.Tensor, "bitwise_or_", lambda t, *a: pytest.fail("an input was written"))
    x = torch.randn(3, 8).to(torch.bfloat16)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    for _ in range(2):
        benchmod.barrier(torch.device("cpu"), torch.ones(1), (x, None, ids), warm=warm)
    sizes = [3 * 8 * 2, 3 * 2 * 4] if warm == "scratch" else [benchmod.LAUNCH_CONTROL_BYTES] * 2
    if warm == "fill":
        assert not read and all(bool((t == 1).all()) for t in filled)  # bits unchanged: ones
        read = filled
    assert [t.numel() for t in read] == sizes * 2  # the inputs' bytes, or the launch control's
    assert all(t.dtype == torch.uint8 and t.data_ptr() not in (x.data_ptr(), ids.data_ptr()) for t in read)
    assert read[0].data_ptr() == read[2].data_ptr()  # the same buffer each time
    if warm == "launch-out":  # one given output, the scratch's first bytes untouched by the reads
        assert len(outs) == 4 and outs[0].dim() == 0 and len({o.data_ptr() for o in outs}) == 1
        assert outs[0].data_ptr() not in (t.data_ptr() for t in read) and int(outs[0]) == 1
    else:
        assert not outs


def test_bench_inputs_are_cold_unless_warm_inputs() -> None:
    """A preset's default warm_by ("read") says how warm inputs are touched, not that they are:
    without warm_inputs the barrier touches nothing (9d47826 made every default bench warm)."""
    from moe_backend.cli import resolve_preset
    from moe_backend.config import load_bench

    def warm_mode(warm_inputs: bool, warm_by: str | None) -> str:
        flagged = load_bench(resolve_preset("deepseek_decode")).bench
        flagged.apply_warm_flags(warm_inputs, warm_by)
        return flagged.warm_mode()

    bench = load_bench(resolve_preset("deepseek_decode")).bench
    assert bench.warm_by == "read" and not bench.warm_inputs
    assert bench.warm_mode() == ""
    bench.warm_by = "write"
    assert bench.warm_mode() == ""
    bench.warm_inputs = True
    assert bench.warm_mode() == "write"
    bench.warm_by = "read"
    assert bench.warm_mode() == "read"
    # the command line's pair: --warm-by (None unless given) implies warm inputs
    assert warm_mode(False, None) == "" and warm_mode(True, None) == "read" and warm_mode(False, "write") == "write"


@pytest.mark.parametrize("warm_by, note", [
    ("write", r"inputs warm \(rewritten\)"),
    ("scratch", r"control: a scratch buffer of each input's size read before each call, inputs cold"),
    ("launch", r"control: 16 bytes read for each input before each call, inputs cold"),
    ("launch-out", r"control: 16 bytes read into a given output for each input before each call, inputs cold"),
    ("fill", r"control: 16 bytes filled for each input before each call, inputs cold"),
])
def test_bench_warm_by_is_recorded(tmp_path: Path, warm_by: str, note: str) -> None:
    """--warm-by implies --warm-inputs; the JSON records it and the table says so."""
    out = tmp_path / "warm.json"
    res = cli("bench", "--backend", "reference", "--iters", "2", "--warmup", "0", "--num-tokens", "2",
              "--warm-by", warm_by, "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"== deepseek-decode: .*; " + note, res.stdout)
    bench = json.loads(out.read_text())["results"][0]["config"]["bench"]
    assert bench["warm_inputs"] is True and bench["warm_by"] == warm_by


def test_bench_rejects_an_unknown_warm_by() -> None:
    from moe_backend.cli import resolve_preset
    from moe_backend.config import ConfigError, load_bench

    preset = load_bench(resolve_preset("deepseek_decode"))
    preset.bench.warm_by = "sideways"
    with pytest.raises(ConfigError, match="bench.warm_by must be one of"):
        preset.validate()
    res = cli("bench", "--backend", "reference", "--warm-by", "sideways")
    assert res.returncode == 2 and "invalid choice" in res.stderr


def test_barrier_reads_the_inputs_before_it_waits(monkeypatch) -> None:
    """The warm reads come before the barrier's wait, so nothing runs between the wait and the op."""
    from moe_backend import bench as benchmod

    events = []
    real = torch.Tensor.amax
    monkeypatch.setattr(torch.Tensor, "amax", lambda t, *a, **k: events.append("read") or real(t, *a, **k))
    monkeypatch.setattr(benchmod.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(benchmod.dist, "barrier", lambda *a, **k: events.append("wait"))
    benchmod.barrier(torch.device("cpu"), torch.ones(1), (torch.randn(4), torch.randn(2)), warm="read")
    assert events == ["read", "read", "wait"]


def test_padded_filled_rows_are_touched_in_place_and_kept() -> None:
    """--warm-inputs touches the padded combine's filled rows in place: slot (l * G + g) * M + i for
    i below counts[l, g], in slot order, and no other; every value stays as it was."""
    from moe_backend import bench as benchmod

    experts, groups, slots, hidden = 3, 2, 4, 5
    counts = torch.tensor([[1, 0], [4, 2], [0, 3]], dtype=torch.int32)
    want = [(e * groups + g) * slots + i
            for e in range(experts) for g in range(groups) for i in range(int(counts[e, g]))]
    assert benchmod.padded_filled_index(counts, slots).tolist() == want
    y = torch.randn(experts, groups * slots, hidden).to(torch.bfloat16)
    before = y.clone()
    benchmod.touch_padded_filled_rows(y, counts, "read")
    assert torch.equal(y.view(torch.int16), before.view(torch.int16))  # bit for bit
    # Which rows were written: -0.0 plus zero is +0.0, so exactly the filled rows lose their sign.
    z = torch.full((experts, groups * slots, hidden), -0.0, dtype=torch.bfloat16)
    for cold in ("", "scratch", "launch", "launch-out", "fill"):  # cold: nothing; the controls: a scratch buffer
        benchmod.touch_padded_filled_rows(z, counts, cold)
        assert torch.signbit(z).all()
    assert (z.device, len(want) * hidden * 2) in benchmod._scratch  # the filled rows' bytes, read
    assert (z.device, benchmod.LAUNCH_CONTROL_BYTES) in benchmod._scratch
    benchmod.touch_padded_filled_rows(z, counts, "write")
    written = torch.signbit(z.view(-1, hidden)).logical_not().all(dim=1).nonzero().squeeze(1).tolist()
    assert written == want and not torch.signbit(z.view(-1, hidden)[want]).any()
