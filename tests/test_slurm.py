"""The Slurm path against a real Slurm: install it (Debian packages), start slurmctld and
slurmd on this machine, submit scripts/slurm/train.sbatch for a 2-process CPU job of the
tiny config, wait, check the job's log, and stop the daemons (also on failure).

Skipped only where it cannot run at all: not root, or no apt-get/Slurm on the machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "scripts" / "slurm" / "local_cluster.sh"
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
STEPS = 12


def _installed() -> bool:
    return all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged"))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("needs root to install and run slurmctld/slurmd/munged")
    if not _installed() and shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and apt-get is unavailable to install it")
    if not _installed():
        subprocess.run(["bash", str(CLUSTER), "install"], check=True, timeout=300)
    state = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    try:
        subprocess.run(["bash", str(CLUSTER), "start", str(state)], check=True, timeout=120, env=env)
        yield env
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(state)], timeout=60)
        for name in ("slurmctld", "slurmd"):
            log = state / f"{name}.log"
            if log.exists():  # kept in pytest's output on failure
                print(f"--- {name}.log (tail) ---\n" + "\n".join(log.read_text().splitlines()[-15:]))


def _job_state(job: str, env: dict[str, str]) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, env=env).stdout
    match = re.search(r"JobState=(\w+)", out)
    return match.group(1) if match else "UNKNOWN"


def test_sbatch_trains_tiny_config(slurm: dict[str, str], tmp_path: Path) -> None:
    env = {**slurm, "NPROC_PER_NODE": "2", "MOE_BACKEND_ROOT": str(ROOT), "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "job.out"
    out_dir = tmp_path / "train"
    job = subprocess.run(
        ["sbatch", "--parsable", "-N", "1", "--chdir", str(ROOT), "-o", str(log),
         str(ROOT / "scripts" / "slurm" / "train.sbatch"),
         "--config", "tiny", "--steps", str(STEPS), "--out", str(out_dir)],
        capture_output=True, text=True, env=env, check=True, timeout=60,
    ).stdout.strip().split(";")[0]
    deadline = time.monotonic() + 180
    state = "PENDING"
    while time.monotonic() < deadline:
        state = _job_state(job, env)
        if state in FINAL_STATES:
            break
        time.sleep(1)
    else:
        subprocess.run(["scancel", job], env=env)
    text = log.read_text() if log.exists() else "(no job log)"
    assert state == "COMPLETED", f"job {job} ended {state}; log:\n{text[-4000:]}"
    # torchrun's 2 ranks on one node: rendezvous from Slurm's variables, the final step line.
    assert f"step {STEPS:>4}/{STEPS}" in text, text[-4000:]
    assert "dispatcher reference, 2 ranks on cpu" in text
    assert re.search(r"\[launch\] job \d+ node 0/1 .*: 2 procs, rendezvous \S+:\d+, nvshmem preset nvlink", text)
    result = json.loads((out_dir / "train_log.json").read_text())
    losses = [s["loss"] for s in result["steps"]]
    assert len(losses) == STEPS and losses[-1] < losses[0]
