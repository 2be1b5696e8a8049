"""scripts/step_costs.py: the load chains it lays out, and its argument checks (the probe itself
runs on a GPU: tests/gpu/test_nvshmem_single.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "step_costs.py"
_spec = importlib.util.spec_from_file_location("step_costs", SCRIPT)
step_costs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(step_costs)


@pytest.mark.parametrize("nodes, spacing, starts", [(64, 16, [0, 5, 70]), (257, 8192, [3]), (2, 1, [1])])
def test_chain_is_one_cycle_through_every_line(nodes: int, spacing: int, starts: list[int]) -> None:
    words, order = step_costs.chain_layout(nodes, spacing, starts, seed=11)
    head = -(-len(starts) // 16) * 16
    assert words.numel() == head + nodes * spacing
    assert sorted(order.tolist()) == [head + i * spacing for i in range(nodes)]
    for b, start in enumerate(starts):  # header word b: the line at position start of the cycle
        assert int(words[b]) == int(order[start % nodes])
    seen, i = [], int(words[0])
    for _ in range(nodes):  # the walk the kernel takes: every line once, then back to the first
        seen.append(i)
        i = int(words[i])
    assert sorted(seen) == sorted(order.tolist()) and i == int(words[0])


def test_chain_rejects_degenerate_layouts() -> None:
    with pytest.raises(ValueError, match="nodes >= 2"):
        step_costs.chain_layout(1, 16, [0], seed=0)
    with pytest.raises(ValueError, match="at least one start"):
        step_costs.chain_layout(8, 16, [], seed=0)


def test_cli_rejects_bad_counts() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--reps", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--reps and --trials must be >= 1" in proc.stderr
