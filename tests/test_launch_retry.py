"""launch.spawn retries a rendezvous whose port was taken, and only that."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from moe_backend.launch import spawn


def _fails_once_with_port_taken(marker: str) -> None:
    path = Path(marker)
    attempts = int(path.read_text()) if path.exists() else 0
    path.write_text(str(attempts + 1))
    if attempts == 0:
        raise RuntimeError("The server socket has failed to listen: EADDRINUSE, address already in use")


def _fails_with(marker: str) -> None:
    path = Path(marker)
    path.write_text(str(int(path.read_text()) + 1 if path.exists() else 1))
    raise ValueError("a real failure")


def test_port_taken_is_retried(tmp_path: Path) -> None:
    marker = str(tmp_path / "attempts")
    spawn(_fails_once_with_port_taken, 1, marker, timeout=120)
    assert Path(marker).read_text() == "2"


def test_other_failures_are_not_retried(tmp_path: Path) -> None:
    marker = str(tmp_path / "attempts")
    with pytest.raises(RuntimeError, match="a real failure"):
        spawn(_fails_with, 1, marker, timeout=120)
    assert Path(marker).read_text() == "1"
    assert os.path.exists(marker)
