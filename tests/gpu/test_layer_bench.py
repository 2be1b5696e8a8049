"""`moe-backend layer-bench --quick` end to end on 2 GPUs (NCCL): the JSON is complete and sane.

Tiny shapes, 1 warm-up + 2 measured iterations: this checks the tool (every dispatcher
builds the same layer, runs forward + backward, is timed, agrees with alltoall's output),
not the numbers; the benchmark of record is scripts/gpu_layer_bench.sh.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA GPUs", allow_module_level=True)
pytest.importorskip("megatron.core", reason="megatron-core is not importable")

ROOT = Path(__file__).resolve().parents[2]


def test_layer_bench_quick_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "layer_bench.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "moe_backend.cli", "layer-bench", "--quick", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    print(res.stdout[-6000:], res.stderr[-6000:])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    report = json.loads(out.read_text())
    from moe_backend.backends import nvshmem_available  # after the run: this process keeps the GPUs free

    assert {"date", "commit", "gpus", "torch", "world_size"} <= set(report["machine"])
    assert report["machine"]["world_size"] == 2 and report["method"]["quick"] is True
    assert [e["shape"] for e in report["results"]] == ["deepseek", "mixtral"]
    must_run = ["alltoall", "allgather", "reference"] + (["nvshmem"] if nvshmem_available()[0] else [])
    for entry in report["results"]:
        got = entry["dispatchers"]
        assert set(got) == {"alltoall", "nvshmem", "reference", "allgather", "flex"}, got.keys()
        for name in must_run:
            r = got[name]
            assert r["status"] == "ok", f"{entry['shape']}/{name}: {r.get('error')}\n{r.get('traceback', '')}"
            ms = r["ms"]
            for key in ("fwd", "bwd", "fwd_bwd", "dispatch_fwd", "combine_fwd", "dispatch_comm_fwd",
                        "combine_comm_fwd"):
                assert 0 < ms[key]["p10"] <= ms[key]["median"] <= ms[key]["p90"], (name, key, ms[key])
            assert ms["dispatch_comm_fwd"]["median"] <= ms["dispatch_fwd"]["median"] * 1.05 + 0.05
            assert 0 < r["shares"]["dispatch_combine_share_fwd_bwd"] < 1, r["shares"]
            if name != "alltoall":  # same weights, input and routes: the same output up to bf16 rounding
                assert r["check"]["baseline"] == "alltoall"
                for what in ("out", "grad_input"):
                    assert r["check"][what]["rel_l2"] < 0.05, (entry["shape"], name, what, r["check"])
        for name in must_run:
            if name != "alltoall":
                v = entry["vs_alltoall"][name]
                assert v["time_ratio"] > 0 and isinstance(v["no_slower_than_alltoall"], bool)
    assert set(report["done_criterion"]) == {"nvshmem", "reference"}
    assert "== deepseek:" in res.stdout and "== mixtral:" in res.stdout
