"""scripts/profile_comm_layer.py (the Communicator layer's host time over a null backend) runs on
a CPU and reports a positive time per call for both ops; a bad --iters is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "profile_comm_layer.py"


def test_reports_both_ops(tmp_path: Path) -> None:
    out = tmp_path / "layer.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--iters", "40", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    us = json.loads(out.read_text())["us_per_call"]
    assert set(us) == {"dispatch", "combine"}, us
    assert all(0 < v < 10_000 for v in us.values()), us
    assert "comm.dispatch" in done.stdout and "comm.combine" in done.stdout, done.stdout


def test_refuses_too_few_iterations() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--iters", "5"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--iters must be at least 20" in done.stderr, done.stderr
