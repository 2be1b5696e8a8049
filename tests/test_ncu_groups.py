"""scripts/ncu_groups.py: instructions grouped by execution count and stall samples, from an
ncu source-page CSV."""

from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ncu_groups.py"
spec = importlib.util.spec_from_file_location("ncu_groups", SCRIPT)
ncu_groups = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ncu_groups)
HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
          "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)"]


def _write(path: Path, rows: list[list[str]]) -> None:
    lines = ['"Kernel Name","void k()"', ",".join(f'"{h}"' for h in HEADER)]
    lines += [",".join(f'"{c}"' for c in r) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def test_groups_loop_levels_and_ranks_stalls(tmp_path: Path) -> None:
    csv_path = tmp_path / "k_sass.csv"
    _write(csv_path, [
        ["0x10", "LDS.128 R8, [R29]", "5", "1,000,000", "4", "1", "0"],
        ["0x20", "FADD R1, R2, R3", "1", "1,000,000", "0", "1", "0"],
        ["0x30", "SHF.L.U32 R4, R40, 0x10, RZ", "30", "10,000", "29", "1", "0"],
    ])
    out = subprocess.run([sys.executable, str(SCRIPT), str(csv_path)], check=True, capture_output=True,
                         text=True).stdout
    assert "2.01M warp instructions executed, 3 instructions" in out  # 2,010,000 in all
    assert "1,000,000 x     2 =    2.00M" in out and "10,000 x     1 =    0.01M" in out
    assert "stall_long_sb                 91.7%" in out  # 33 of 36 samples; the Not-Issued column left out
    top = out.split("most samples")[1].splitlines()[1]
    assert "SHF.L.U32" in top and "stall_long_sb" in top and "(83.3%)" in top


def test_rejects_a_file_that_is_not_a_source_export(tmp_path: Path) -> None:
    bad = tmp_path / "raw.csv"
    bad.write_text('"ID","Kernel Name"\n"0","k"\n')
    res = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True)
    assert res.returncode != 0 and "not an ncu source CSV" in res.stderr


def test_barrier_waits_go_to_the_barrier_before_them_and_read_gzip(tmp_path: Path) -> None:
    """A warp waiting at a barrier is sampled at a later instruction: its stall_barrier samples
    count for the BAR.SYNC before it (a MEMBAR is no barrier), converted into warp-time."""
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier",
              "stall_long_sb"]
    rows = [
        ["0x10", "BAR.SYNC.DEFER_BLOCKING 0x0", "0", "8", "0", "0"],
        ["0x20", "@P0 BRA 0x40", "6", "8", "6", "0"],
        ["0x30", "MEMBAR.SC.GPU", "2", "8", "2", "0"],
        ["0x40", "LDG.E R1, desc[UR4][R2.64]", "4", "1", "0", "4"],
        ["0x50", "BAR.SYNC.DEFER_BLOCKING 0x0", "0", "8", "0", "0"],
        ["0x60", "EXIT", "8", "8", "8", "0"],
    ]
    lines = ['"Kernel Name","void k()"'] + [",".join(f'"{c}"' for c in r) for r in [header, *rows]]
    csv_path = tmp_path / "k_sass.csv.gz"
    with gzip.open(csv_path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, str(SCRIPT), str(csv_path), "--duration-us", "10", "--warps", "8"],
                         check=True, capture_output=True, text=True).stdout
    waits = out.split("barrier waits")[1].splitlines()
    assert "warp-us at 4.00 a sample" in waits[0]  # 8 warps x 10 us / 20 samples
    assert "#0" in waits[1] and "     8 (40.0%)" in waits[1] and "32.0 warp-us" in waits[1]  # 6 + the MEMBAR's 2
    assert "#4" in waits[2] and "     8 (40.0%)" in waits[2] and "32.0 warp-us" in waits[2]
    assert len(waits) == 3


def test_runs_are_the_stretches_of_code_that_ran(tmp_path: Path) -> None:
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_no_inst"]
    rows = [["0x1000", "LDC R1", "3", "64", "3"], ["0x1010", "S2R R0", "0", "64", "0"],
            ["0x1020", "BRA 0x1600", "1", "64", "1"], ["0x1030", "IADD3 R2", "0", "0", "0"],
            ["0x1600", "ISETP P0", "5", "32", "5"], ["0x1610", "EXIT", "0", "32", "0"],
            ["0x1620", "BRA 0x1620", "0", "0", "0"], ["0x1720", "MOV R3", "2", "2", "2"]]
    lines = ['"Kernel Name","void k()"', ",".join(f'"{h}"' for h in header)]
    lines += [",".join(f'"{c}"' for c in r) for r in rows]
    path = tmp_path / "k_sass.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, str(SCRIPT), str(path), "--runs"], check=True, capture_output=True,
                         text=True).stdout
    assert "code run: 3 stretches, reached by 1 jumps of >= 1 KB and 1 of 256 B - 1 KB" in out
    table = out.split("no_inst      gap")[1].split()
    # start, end, instructions, warps, no_inst, gap of each stretch
    assert table == ["0x0", "0x20", "3", "64", "4", "0", "0x600", "0x610", "2", "32", "5", "1488",
                     "0x720", "0x720", "1", "2", "2", "256"]


def test_split_finds_a_loop_run_by_two_groups_of_a_warp(tmp_path: Path) -> None:
    """A loop body that a warp ran as lane 0 and lanes 1-31 apart (16 threads a run on average)
    is reported with the warp instructions it cost above full warps; code run by full warps, or
    run once by one lane, ranks below it. A second kernel's rows in the export are left out."""
    header = ["Address", "Source", "Instructions Executed", "Thread Instructions Executed"]
    rows = [["0x100", "LDC R1", "64", "2048"],           # full warps
            ["0x110", "@P0 BRA 0x200", "64", "64"],      # one lane a warp, once
            ["0x120", "LD.E.128 R4", "1000", "16000"],   # the split loop: 1000 runs x 16 threads
            ["0x130", "FADD R1", "1000", "16000"],
            ["0x140", "EXIT", "64", "2048"]]
    lines = ['"Kernel Name","void k()"', ",".join(f'"{h}"' for h in header)]
    lines += [",".join(f'"{c}"' for c in r) for r in rows]
    lines += ['"Kernel Name","void other()"', ",".join(f'"{h}"' for h in header), '"0x0","NOP","9","9"']
    path = tmp_path / "k_sass.csv"
    path.write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, str(SCRIPT), str(path), "--split"], check=True, capture_output=True,
                         text=True).stdout
    assert ", 5 instructions in the kernel" in out  # the second kernel's NOP not read
    split = out.split("split warps:")[1].splitlines()
    # 2 x (1000 - 500) + (64 - 2) = 1062 warp instructions above full warps, of 2192
    assert split[0].startswith(" 0.00M warp instructions (48.4%)")
    # offsets from the kernel's first instruction (0x100)
    assert "0x20" in split[2] and "0x30" in split[2] and "1,000" in split[2] and "16.0" in split[2]
    assert "0x10" in split[3] and " 1.0" in split[3]
    assert len(split) == 4


def test_split_needs_the_thread_counts(tmp_path: Path) -> None:
    csv_path = tmp_path / "k_sass.csv"
    _write(csv_path, [["0x10", "FADD R1, R2, R3", "1", "100", "0", "1", "0"]])
    res = subprocess.run([sys.executable, str(SCRIPT), str(csv_path), "--split"], capture_output=True, text=True)
    assert res.returncode != 0 and "Thread Instructions Executed" in res.stderr


def _export(path: Path, header: list[str], launches: list[list[list[str]]]) -> None:
    lines: list[str] = []
    for rows in launches:
        lines += ['"Kernel Name","void k()"', ",".join(f'"{h}"' for h in header)]
        lines += [",".join(f'"{c}"' for c in r) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def test_launches_sums_every_launch_and_rejects_another_kernel(tmp_path: Path) -> None:
    """Default: the first launch's counts; --launches: the counts summed instruction by
    instruction, the averages averaged; launches of another kernel are refused."""
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
              "Avg. Threads Executed", "stall_long_sb", "stall_no_inst"]
    one = [["0x10", "LDG.E R1, desc[UR4][R2.64]", "3", "1,000,001", "32", "3", "0"],
           ["0x20", "EXIT", "1", "4", "32", "0", "1"]]
    two = [["0x10", "LDG.E R1, desc[UR4][R2.64]", "5", "1,000,001", "16", "1", "4"],
           ["0x20", "EXIT", "2", "4", "32", "0", "2"]]
    path = tmp_path / "k_sass.csv"
    _export(path, header, [one, one, two, two])  # ncu prints each launch's table twice
    first = subprocess.run([sys.executable, str(SCRIPT), str(path)], check=True, capture_output=True,
                           text=True).stdout
    assert "2 launches in the export; the first one's counts" in first
    assert "1.00M warp instructions executed, 2 instructions" in first
    assert "stall_long_sb                 75.0%" in first  # 3 of 4 samples
    summed = subprocess.run([sys.executable, str(SCRIPT), str(path), "--launches"], check=True,
                            capture_output=True, text=True).stdout
    assert "their counts summed" in summed
    assert "2,000,002 x     1" in summed  # exact: no rounding of large sums
    assert "stall_no_inst                 63.6%" in summed  # 7 of 11 samples
    assert "stall_long_sb                 36.4%" in summed  # 4 of 11
    rows = ncu_groups.sum_launches(header, [one, two])
    assert rows[0][4] == "24" and rows[0][0] == "0x10" and rows[1][2] == "3"
    other = [["0x10", "LDS R1, [R2]", "1", "1", "32", "1", "0"], one[1]]
    _export(path, header, [one, other])
    res = subprocess.run([sys.executable, str(SCRIPT), str(path), "--launches"], capture_output=True, text=True)
    assert res.returncode != 0 and "launch 2 is not the first launch's kernel" in res.stderr
