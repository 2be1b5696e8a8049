"""The `nvshmem` backend's tuning variables (`MOE_BACKEND_NVSHMEM_*`), checked before an arena is made.

The kernels read most of them in C++ (`create_ctx`), where an unknown value would silently mean
the default: `WHOLE_COMBINE=off` would leave the PDL combine on. So every variable of the family
must be one this module knows, holding a value its reader accepts; a misspelt name (a switch
that would do nothing) is refused with the closest known names. docs/PERF_NOTES.md names each
switch's round and measurement.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

PREFIX = "MOE_BACKEND_NVSHMEM_"

# On/off switches of the kernels (C++ env_switch): "0" or "1"; unset or empty: the default.
SWITCHES = frozenset({
    "CARVEOUT", "CE_FLAG_COPY", "CE_FLAG_FENCE", "CE_SEND", "COMBINE_ASYNC", "COMBINE_BULK", "COMBINE_BULK_RECV",
    "COMBINE_STEP_BULK", "COMBINE_FUSED", "COMBINE_OVERLAP", "COMPACT_RECV", "COPY_BULK", "DIRECT_RECV", "EARLY_LOAD",
    "ENTRY_LAST", "ENTRY_RELEASE", "FINISH_BLOCK0", "FUSED_DISPATCH", "ITEM_GRIDS", "ITEM_SPREAD", "LEAN_FUSED",
    "LL_TABLE", "OVERLAP", "PAR_SCAN", "PDL", "PLAN_VEC", "PUT_DIRECT", "PUT_FROM_X", "RECV_PREFETCH",
    "SELF_SEND", "SMALL_FUSED", "TABLE_PREFETCH", "TOKEN_RELEASE", "TWO_PART_RECV", "WHOLE_COMBINE", "WIDE_RECV",
})
# Counts the kernels read with atoi (which would take "eight" as 0): positive integers only; the
# C++ side clamps them to its range.
COUNTS = frozenset({"CE_CHUNKS", "CE_STREAMS", "COPY_PIECES", "DIRECT_TABLE_BLOCKS", "OVERLAP_SMS"})
# Read and checked by their own readers: CE_DECAY (create_ctx), COMBINE_ITEMS, LL_COMBINE,
# LL_COMBINE_BY_CALL, LL_ROWS, PADDED, PADDED_PARTIALS, PUT_TAGGED, BOOTSTRAP (nvshmem_runtime), PRESET
# (the launch scripts' transport preset, scripts/slurm).
CHECKED_ELSEWHERE = frozenset({"BOOTSTRAP", "CE_DECAY", "COMBINE_ITEMS", "LL_COMBINE", "LL_COMBINE_BY_CALL", "LL_ROWS",
                               "PADDED", "PADDED_PARTIALS", "PRESET", "PUT_TAGGED"})
KNOWN = SWITCHES | COUNTS | CHECKED_ELSEWHERE


def check_env(environ: Mapping[str, str] | None = None) -> None:
    """Raise ValueError naming each `MOE_BACKEND_NVSHMEM_*` variable that is unknown or holds a
    value its reader would not take (all of them at once)."""
    env = os.environ if environ is None else environ
    problems = []
    for name in sorted(env):
        if not name.startswith(PREFIX):
            continue
        key, value = name[len(PREFIX):], env[name]
        if key not in KNOWN:
            close = difflib.get_close_matches(key, sorted(KNOWN), n=3)
            hint = f" (did you mean {', '.join(PREFIX + c for c in close)}?)" if close else ""
            problems.append(f"{name} is not a variable of the nvshmem backend{hint}")
        elif value == "" or key in CHECKED_ELSEWHERE:
            continue
        elif key in SWITCHES and value not in ("0", "1"):
            problems.append(f"{name} must be 0 or 1, got {value!r}")
        elif key in COUNTS and not (value.isdigit() and int(value) >= 1):
            problems.append(f"{name} must be a positive integer, got {value!r}")
    if problems:
        raise ValueError("; ".join(problems))
