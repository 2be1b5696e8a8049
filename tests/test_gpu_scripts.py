"""The GPU scripts' argument checks, which run anywhere: a bad call stops before any build or
device work, with exit status 2 and a message naming what is wrong."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
AB_BUILD = ROOT / "scripts" / "gpu_ab_build.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(AB_BUILD), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "usage: scripts/gpu_ab_build.sh OUT_DIR PRESET PREV_DIR"),
        (("out", "deepseek_prefill"), "usage:"),
        (("out", "deepseek_prefill", "/nonexistent/prev"), "PREV_DIR '/nonexistent/prev' is not a directory"),
        (("out", "deepseek_prefill", ".", "0"), "ROUNDS must be a positive integer, got '0'"),
        (("out", "deepseek_prefill", ".", "two"), "ROUNDS must be a positive integer, got 'two'"),
    ],
)
def test_ab_build_refuses_bad_arguments(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    args = tuple(str(tmp_path / a) if a == "out" else a for a in args)
    done = _run(*args)
    assert done.returncode == 2, done
    assert message in done.stderr
    assert not (tmp_path / "out").exists()  # nothing made before the checks passed
