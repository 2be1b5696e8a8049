"""Step-by-step comparison in a `train-bench` result (interleaved schedule): the first
dispatcher's step time minus each other's, per step, over the timed steps.

    python3 scripts/train_bench_paired.py OUT/train_bench_<config>/bench.json ...

Prints what `train-bench` appends to its table (older results lack it in their JSON).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from moe_backend.training.bench import paired_lines, paired_steps  # noqa: E402


def main(paths: list[str]) -> int:
    if not paths:
        print(__doc__)
        return 2
    for path in paths:
        result = json.loads(Path(path).read_text())
        print(f"{path} ({result.get('config')}, schedule {result.get('schedule', 'sequential')}):")
        for line in paired_lines(paired_steps(result["runs"])):
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
