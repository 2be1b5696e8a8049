"""The examples in examples/ run as documented (2 local gloo processes on CPU) and check
their own results against a dense computation: keeping them here keeps them true."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("script, says", [
    ("dispatch_combine.py", "dispatch + experts + combine match the dense computation"),
    ("training_step.py", "the expert weights match the dense model"),
    ("decode_step.py", "every step matches the dense computation"),
    ("decode_step.py --padded", "(eagerly, padded layout): every step matches the dense computation"),
])
def test_example_runs_and_checks_itself(script: str, says: str) -> None:
    name, *args = script.split()
    run = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count(says) == 2, run.stdout  # both ranks
