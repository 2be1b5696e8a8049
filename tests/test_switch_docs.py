"""Every environment switch the kernels' host code reads is documented: named in the nvshmem
backend's docstring, docs/KERNELS.md or docs/PERF_NOTES.md (where the measurement behind its
default lives)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWITCH = re.compile(r"MOE_BACKEND_NVSHMEM_[A-Z0-9_]*[A-Z0-9]")


def switches_read() -> set[str]:
    names: set[str] = set()
    for path in sorted((ROOT / "csrc").glob("*")):
        if path.suffix in {".cu", ".cuh", ".h", ".cpp"}:
            names |= set(SWITCH.findall(path.read_text()))
    return names


def test_every_switch_is_documented() -> None:
    names = switches_read()
    assert len(names) >= 20, f"expected the kernels' switches, found {sorted(names)}"
    docs = "".join(path.read_text() for path in (ROOT / "moe_backend" / "backends" / "nvshmem.py",
                                                 ROOT / "docs" / "KERNELS.md", ROOT / "docs" / "PERF_NOTES.md"))
    # By its full name, or by its short name as the docs write a setting: `NAME`, `NAME=0`;
    # whole names only (OVERLAP is not named by COMBINE_OVERLAP, nor COMBINE_BULK by COMBINE_BULK_RECV).
    def named(n: str) -> bool:
        short = re.escape(n.removeprefix("MOE_BACKEND_NVSHMEM_"))
        edge = r"(?<![A-Z0-9_])"
        return bool(re.search(rf"{edge}{re.escape(n)}(?![A-Z0-9_])", docs)
                    or re.search(rf"`{short}`", docs) or re.search(rf"{edge}{short}=", docs))

    missing = sorted(n for n in names if not named(n))
    assert not missing, f"switches read in csrc/ but named in no doc (docstring, KERNELS.md, PERF_NOTES.md): {missing}"
