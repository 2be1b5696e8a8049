"""Install moe_backend's dependencies into the running venv with a small disk peak.

One `pip install` of torch's CUDA build holds every downloaded wheel (~3 GB) while it
unpacks them (~6 GB): a ~9 GB peak that a CI machine with 6 GB free does not have. So pip
resolves the whole set once (`--dry-run --report`), then installs it a wheel at a time for
the large ones (`--no-deps`, no cache, largest first), so at most one large wheel sits on disk
beside what is installed. `--no-compile` skips the ~0.2 GB of bytecode pip would write for
every module; Python compiles the ones it imports. (triton cannot be left out on a CPU
machine: megatron-core's MoE imports it.)

Usage (from scripts/setup_env.sh): python scripts/install_deps.py REQUIREMENT... [-- PIP_ARGS...]
Our own package, when named (`-e .[extras]`), is resolved for its dependencies but not
installed: setup_env.sh installs it afterwards with `--no-deps`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

OWN_NAME = "moe_backend"
# Wheels of hundreds of MB each, largest first (while little is installed yet): one pip call
# apiece. The rest are small and go in one call.
LARGEST_FIRST = ("torch", "nvidia-cudnn", "nvidia-cublas", "triton")
LARGE_PREFIXES = ("torch", "triton", "nvidia-")


def resolve(requirements: list[str], pip_args: list[str]) -> list[tuple[str, str]]:
    """(name, version) of every package pip would install for `requirements`, in its order."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        pip(["--dry-run", "--report", report, *pip_args, *requirements])
        with open(report) as f:
            items = json.load(f)["install"]
    return [(it["metadata"]["name"], it["metadata"]["version"]) for it in items]


def pip(args: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-compile", *args]
    subprocess.run(cmd, check=True)


def normalized(name: str) -> str:
    return name.lower().replace("_", "-")


def large_first_rank(pin: str) -> int:
    """Position of a large wheel in install order: the known largest first, then the rest."""
    key = normalized(pin.split("==")[0])
    ranks = [i for i, prefix in enumerate(LARGEST_FIRST) if key.startswith(prefix)]
    return ranks[0] if ranks else len(LARGEST_FIRST)


def plan(packages: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Split the resolved set into (large pins, one call each, largest first) and small pins."""
    large: list[str] = []
    small: list[str] = []
    for name, version in packages:
        key = normalized(name)
        if key == normalized(OWN_NAME):
            continue
        (large if key.startswith(LARGE_PREFIXES) else small).append(f"{name}=={version}")
    return sorted(large, key=large_first_rank), small


def main(argv: list[str]) -> None:
    split = argv.index("--") if "--" in argv else len(argv)
    requirements, pip_args = argv[:split], argv[split + 1 :]
    large, small = plan(resolve(requirements, pip_args))
    for pin in large:
        pip(["--no-deps", *pip_args, pin])
    if small:
        pip(["--no-deps", *pip_args, *small])


if __name__ == "__main__":
    main(sys.argv[1:])
