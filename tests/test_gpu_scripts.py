"""The GPU scripts' argument checks, which run anywhere: a bad call stops before any build or
device work, with exit status 2 and a message naming what is wrong."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

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


def test_ab_build_benches_the_preset_it_was_given(tmp_path: Path) -> None:
    """Both builds are benched on the PRESET argument, alternately, ROUNDS times (round 30's call:
    sourcing nvshmem_env.sh overwrote a variable named `preset` with "nvlink", and every bench
    failed). Runs on a copy of the scripts with a stand-in PYTHON that records the bench calls
    and fakes the build, so nothing of this checkout is touched."""
    repo = tmp_path / "repo"
    (repo / "moe_backend").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(ROOT / "scripts"), str(repo / "scripts")], check=True)
    calls = tmp_path / "bench_calls.txt"
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = setup.py ]; then touch moe_backend/_C.fake.so; exit 0; fi\n'
        f'if [ "$1" = -m ]; then echo "$(pwd) $*" >> {calls}; exit 0; fi\n'
        'exec python3 "$@"\n'
    )
    fake.chmod(0o755)
    prev = tmp_path / "prev"
    prev.mkdir()
    done = subprocess.run(["bash", str(repo / "scripts" / "gpu_ab_build.sh"), str(tmp_path / "out"), "deepseek_prefill",
                           str(prev), "2"], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin",
                           "PYTHON": str(fake), "HOME": str(tmp_path)})
    assert done.returncode == 0, done
    lines = calls.read_text().splitlines()
    assert len(lines) == 4, lines
    assert all("moe_backend.cli bench --config deepseek_prefill --backend nvshmem" in line for line in lines), lines
    sides = [line.split()[0] == str(repo) for line in lines]
    assert sides == [True, False, True, False], lines  # new (this tree), prev (the copy), ...


DEVICE_BUILD = ROOT / "scripts" / "build_device_extension.sh"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "usage: scripts/build_device_extension.sh NAME"),
        (("../x",), "NAME: letters, digits"),
        (("stamps", "MOE_BACKEND_STAMPS"), "'MOE_BACKEND_STAMPS' is not VAR=VALUE"),
    ],
)
def test_device_build_refuses_bad_arguments(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    done = subprocess.run(["bash", str(DEVICE_BUILD), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "DEVICE_VENV": str(tmp_path / "venv")})
    assert done.returncode == 2, done
    assert message in done.stderr
    assert not (tmp_path / "venv").exists()  # nothing made before the checks passed


def _gpu_env_with_devso(tmp_path: Path, loads: bool) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Sources a copy of gpu_env.sh with MOE_BACKEND_DEVSO=plain and a carried .devso/plain.so,
    under a stand-in PYTHON whose import of moe_backend._C succeeds or not and whose build
    leaves a marker file."""
    repo = tmp_path / "repo"
    (repo / "moe_backend").mkdir(parents=True)
    (repo / ".devso").mkdir()
    (repo / ".devso" / "plain.so").write_text("carried")
    subprocess.run(["cp", "-r", str(ROOT / "scripts"), str(repo / "scripts")], check=True)
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = setup.py ]; then echo built > moe_backend/_C.built.so; exit 0; fi\n'
        'case "$2" in *moe_backend._C*) exit ' + ("0" if loads else "1") + " ;; "
        "*nvshmem_root*) echo /opt/nvshmem/lib; exit 0 ;; esac\n"
        'exec python3 "$@"\n'
    )
    fake.chmod(0o755)
    done = subprocess.run(["bash", "-c", "out=$PWD; MOE_BACKEND_DEVSO=plain source scripts/gpu_env.sh; "
                           'echo "LD=$LD_LIBRARY_PATH"'], cwd=repo, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "HOME": str(tmp_path)})
    return done, repo


def test_gpu_env_puts_a_carried_build_in_place(tmp_path: Path) -> None:
    done, repo = _gpu_env_with_devso(tmp_path, loads=True)
    assert done.returncode == 0, done
    built = sorted(p.name for p in (repo / "moe_backend").glob("_C*.so"))
    assert len(built) == 1 and built[0] != "_C.built.so", built  # the carried file, no build
    assert (repo / "moe_backend" / built[0]).read_text() == "carried"
    assert "LD=/opt/nvshmem/lib" in done.stdout  # this machine's NVSHMEM library first


def test_gpu_env_builds_when_the_carried_build_does_not_load(tmp_path: Path) -> None:
    done, repo = _gpu_env_with_devso(tmp_path, loads=False)
    assert done.returncode == 0, done
    assert "does not load here: building" in done.stdout
    built = sorted(p.name for p in (repo / "moe_backend").glob("_C*.so"))
    assert built == ["_C.built.so"], built  # the carried file removed, the build ran


def _packed(out: Path, name: str) -> str:
    """The text of a step's file as packed into the call's $OUT/call.tgz."""
    import tarfile

    with tarfile.open(out / "call.tgz") as tar:
        member = tar.extractfile(f"./{name}")
        assert member is not None, name
        return member.read().decode()


def _run_call(tmp_path: Path, fake_python: str, script: str,
              prepare: Callable[[Path], None] = lambda repo: None) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """`script` (sourcing scripts/gpu_call.sh) in a repository of the call's scripts, the device
    setup stubbed out, gpu_devso.sh recording each build it is handed in devso.txt, and python3
    the fake `fake_python` (a bash body); `prepare(repo)` adds what the call is carried before it
    runs. Returns (repo, OUT, the finished run)."""
    repo, out = tmp_path / "repo", tmp_path / "out"
    (repo / "scripts").mkdir(parents=True)
    out.mkdir()
    (repo / "scripts" / "gpu_call.sh").write_text((ROOT / "scripts" / "gpu_call.sh").read_text())
    (repo / "scripts" / "gpu_env.sh").write_text("true\n")
    (repo / "scripts" / "gpu_devso.sh").write_text('echo "devso $MOE_BACKEND_DEVSO" >> devso.txt\n')
    (repo / "bin").mkdir()
    fake = repo / "bin" / "python3"
    fake.write_text("#!/bin/bash\n" + fake_python + "\n")
    fake.chmod(0o755)
    prepare(repo)
    done = subprocess.run(["bash", "-c", script], cwd=repo, capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{repo / 'bin'}:/usr/bin:/bin", "OUT": str(out)})
    assert done.returncode == 0, done
    return repo, out, done


def test_gpu_call_steps_report_and_pack_each_result(tmp_path: Path) -> None:
    """A prepared call's preamble (scripts/gpu_call.sh): the carried build unpacked and named, the
    commit recorded, and each step's log written, its exit status and test summary printed and
    packed, a failing or timed-out step not ending the call."""
    import gzip
    import tarfile

    def carry(repo: Path) -> None:  # a gzipped build and the commit, as the device tool carries them
        (repo / ".devso").mkdir()
        with gzip.open(repo / ".devso" / "b.so.gz", "wt") as f:
            f.write("carried")
        (repo / ".commit").write_text("abc1234\n")

    script = (
        'set -u; source scripts/gpu_call.sh b; echo "DEVSO=$MOE_BACKEND_DEVSO COMMIT=$MOE_BACKEND_COMMIT N=$N"\n'
        'step good good.log 20 bash -c "echo 3 passed in 1.0s"\n'
        'step bad bad.log 20 bash -c "echo 1 failed, 2 passed; exit 3"\n'
        "step slow slow.log 1 sleep 10\n"
        "echo after\n"
    )
    repo, out, done = _run_call(tmp_path, "exit 1", script, carry)
    lines = done.stdout.splitlines()
    assert lines[0] == "DEVSO=b COMMIT=abc1234 N=MOE_BACKEND_NVSHMEM", lines
    assert lines[1].startswith("good rc 0 at ") and lines[2] == "3 passed in 1.0s", lines
    assert lines[3].startswith("bad rc 3 at ") and lines[4] == "1 failed, 2 passed", lines
    assert lines[5].startswith("slow rc 124 at ") and lines[6] == "after", lines
    assert (repo / ".devso" / "b.so").read_text() == "carried"
    with tarfile.open(out / "call.tgz") as tar:
        assert sorted(n for n in tar.getnames() if n.endswith(".log")) == ["./bad.log", "./good.log", "./slow.log"]
    assert [f.name for f in out.iterdir()] == ["call.tgz"]  # the logs themselves stay off $OUT


def test_gpu_call_switches_builds_and_benches_one(tmp_path: Path) -> None:
    """`use_build NAME` hands NAME to gpu_devso.sh (which puts .devso/NAME.so in place);
    `decode_bench_ws1 BUILD TAG` does so and runs the world-size-1 decode bench as a step, its
    log and JSON named BUILDTAG, the contiguous ops through their cross-rank path."""
    repo, out, done = _run_call(  # the fake records the bench's arguments and environment
        tmp_path, 'echo "nvshmem $MOE_BACKEND_DEVSO SELF_SEND=$MOE_BACKEND_NVSHMEM_SELF_SEND $*"',
        "set -u; source scripts/gpu_call.sh a; use_build b; decode_bench_ws1 c x\n")
    assert (repo / "devso.txt").read_text().splitlines() == ["devso b", "devso c"]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("decode bench ws1 cx rc 0 at "), lines
    bench = lines[-1]
    assert bench.startswith("nvshmem c SELF_SEND=1 -m moe_backend.cli bench --config deepseek_decode"), bench
    assert "--world-size 1" in bench and bench.endswith("/raw/decode_ws1_cx.json"), bench
    assert f"--out {out}" not in bench  # $OUT holds only call.tgz
    assert "nvshmem c SELF_SEND=1" in _packed(out, "bench_cx.log")


def test_gpu_call_ab_benches_each_build_in_order(tmp_path: Path) -> None:
    """`decode_ab_ws1 "NAME:TAG ..." ARG...`: decode_bench_ws1 NAME TAG ARG... for each listed build
    in order, an empty tag naming the build alone."""
    repo, out, done = _run_call(tmp_path, 'echo "nvshmem $MOE_BACKEND_DEVSO $*"',
                                'set -u; source scripts/gpu_call.sh m; decode_ab_ws1 "m:a n: m:b" --num-tokens 1 8\n')
    assert (repo / "devso.txt").read_text().splitlines() == ["devso m", "devso n", "devso m"]
    steps = [line.split(" rc ")[0] for line in done.stdout.splitlines() if " rc 0 at " in line]
    assert steps == ["decode bench ws1 ma", "decode bench ws1 n", "decode bench ws1 mb"], done.stdout
    for tag in ("ma", "n", "mb"):
        assert "--num-tokens 1 8 --out" in _packed(out, f"bench_{tag}.log")


def test_gpu_call_runs_the_padded_tests_on_one_gpu_and_shared_ep2(tmp_path: Path) -> None:
    """`padded_tests NAME`: two steps on the build in place, the one-GPU file's padded tests and
    the EP2 file's with both ranks on the GPU, each logged under NAME."""
    _, out, done = _run_call(  # the fake records pytest's arguments and the shared-GPU switches
        tmp_path, 'echo "1 passed shared=${MOE_TEST_SHARED_GPU:-} world=${MOE_TEST_WORLD:-} $*"',
        "set -u; source scripts/gpu_call.sh a; padded_tests p\n")
    single, shared = _packed(out, "tests_padded_single_p.log"), _packed(out, "tests_padded_shared_p.log")
    assert "shared= world=" in single and single.rstrip().endswith("tests/gpu/test_nvshmem_single.py -k padded")
    assert "shared=1 world=2" in shared and shared.rstrip().endswith("tests/gpu/test_nvshmem.py -k padded")
    steps = [line for line in done.stdout.splitlines() if " rc 0 at " in line]
    assert [s.split(" rc ")[0] for s in steps] == ["padded one GPU p", "padded shared EP2 p"]


def _load_profile_timeline() -> ModuleType:
    """scripts/profile_timeline.py as a module (scripts/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("profile_timeline", ROOT / "scripts" / "profile_timeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_timeline_selects_the_overlap_row_or_its_cases() -> None:
    """`--overlap N...` profiles the overlap row (sweep preset, matmul between send and receive)
    at those token counts instead of the decode and prefill cases; the preset filter applies."""
    module = _load_profile_timeline()
    assert module.select_cases("", [64, 128]) == [("deepseek-sweep", 64, "nvlink", "1", True),
                                                  ("deepseek-sweep", 128, "nvlink", "1", True)]
    plain = module.select_cases("", [])
    assert plain == module.CASES and not any(case[4] for case in plain)
    assert {case[0] for case in module.select_cases("prefill", [])} == {"deepseek-prefill"}
    assert module.select_cases("prefill", [64]) == []


def test_profile_timeline_times_the_last_round_from_its_barriers() -> None:
    """The last round's activities, each from the end of its barrier (the all-reduce; at one rank,
    where NCCL launches none, the sleep): a warm mode's touches before the next sleep stay in the
    listing, the sleeps do not; a barrier-less trace says so."""
    module = _load_profile_timeline()

    def act(name: str, ts: float, dur: float, stream: int = 7) -> dict:
        return {"name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}

    one_rank = [act("reduce_kernel amax", 0, 2), act("spin_kernel sleep", 10, 500), act("dispatch_fused", 515, 8),
                act("reduce_kernel amax", 530, 2), act("spin_kernel sleep", 540, 500),
                act("combine_send", 1045, 6), act("combine_recv", 1046.5, 5, stream=9)]
    lines = module._listing(one_rank)
    assert [line.split()[0] for line in lines] == ["--", "stream", "stream", "--", "stream", "stream"]
    assert "start      5.0 us  dur      8.0 us  dispatch_fused" in lines[1]
    assert "start     20.0 us" in lines[2] and lines[2].endswith("reduce_kernel amax")
    assert lines[5].split()[:4] == ["stream", "9", "start", "6.5"]
    two_ranks = [act("ncclDevKernel_AllReduce_Sum", 0, 4), act("spin_kernel sleep", 6, 1), act("dispatch", 12, 3),
                 act("ncclDevKernel_AllReduce_Sum", 20, 4), act("combine", 26, 3)]
    lines = module._listing(two_ranks)
    assert "start      8.0 us" in lines[1] and lines[1].endswith("dispatch") and len(lines) == 4
    assert "start      2.0 us" in lines[3] and lines[3].endswith("combine")
    assert module._listing([act("dispatch", 0, 1)]) == ["(no barrier found in the trace)"]


def test_profile_timeline_takes_medians_over_rounds() -> None:
    """`--rounds N`: each activity's median start and length over the last N rounds, matched by its
    place in its op's section and its name; one missing from some rounds says in how many it ran;
    N beyond the profiled rounds takes them all."""
    module = _load_profile_timeline()

    def act(name: str, ts: float, dur: float) -> dict:
        return {"name": name, "ts": ts, "dur": dur, "args": {"stream": 7}}

    trace = []
    # Five rounds 100 us apart; the dispatch starts 1, 2, 3, 4, 9 us after its sleep ends (median 3)
    # and lasts 5, 6, 7, 8, 9 (median 7); a memset follows it in rounds 2 and 4 only.
    for k, (delay, length) in enumerate([(1, 5), (2, 6), (3, 7), (4, 8), (9, 9)]):
        base = 100.0 * k
        trace += [act("sleep", base, 10), act("dispatch", base + 10 + delay, length)]
        if k in (1, 3):
            trace.append(act("Memset", base + 30, 1))
        trace += [act("sleep", base + 50, 10), act("combine", base + 62, 4 + k)]
    lines = module._listing(trace, rounds=5)
    assert lines[0].endswith("medians of 5 rounds)") and lines[3].startswith("  -- combine")
    assert "start      3.0 us  dur      7.0 us  dispatch" in lines[1] and "  n " not in lines[1]
    assert lines[2].endswith("Memset  n 2")
    assert "start      2.0 us  dur      6.0 us  combine" in lines[4]
    last_two = module._listing(trace, rounds=2)
    assert "start      6.5 us  dur      8.5 us  dispatch" in last_two[1] and "dur      7.5 us  combine" in last_two[4]
    assert module._listing(trace, rounds=50)[0].endswith("medians of 5 rounds)")
    assert "start      9.0 us  dur      9.0 us  dispatch" in module._listing(trace)[1]


def test_profile_timeline_refuses_bad_options() -> None:
    """`--whole` cannot profile the overlap row (it splits send and receive), `--warm-by` takes the
    bench's modes only, `--rounds` at least one: each refused before any process starts, with the reason."""
    script = str(ROOT / "scripts" / "profile_timeline.py")
    both = subprocess.run([sys.executable, script, "out", "--whole", "--overlap", "64"], capture_output=True, text=True)
    assert both.returncode == 2 and "--whole and --overlap exclude each other" in both.stderr
    bad = subprocess.run([sys.executable, script, "out", "--warm-by", "hot"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'hot'" in bad.stderr
    none = subprocess.run([sys.executable, script, "out", "--rounds", "0"], capture_output=True, text=True)
    assert none.returncode == 2 and "--rounds must be at least 1, got 0" in none.stderr


def test_kernel_timeline_names_the_stamps_in_enum_order() -> None:
    """scripts/kernel_timeline.py reads the stamps by position: its names must follow the kernels'
    `enum Stamp` (csrc/device_common.cuh), `ST_PAD_ROWS` as `pad_rows`."""
    import ast
    import re

    text = (ROOT / "csrc" / "device_common.cuh").read_text()
    body = re.search(r"enum Stamp \{(.*?)NSTAMP", text, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    enum = [name.split("=")[0].strip().removeprefix("ST_").lower() for name in body.split(",") if name.strip()]
    script = (ROOT / "scripts" / "kernel_timeline.py").read_text()
    tree = ast.parse(script)
    stamps = next(ast.literal_eval(node.value) for node in tree.body
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "STAMPS")
    aliases = {"csend": "combine_send", "csend_items": "combine_send_items",
               "crecv": "combine_recv", "csend_summed": "combine_send_summed",
               "csend_fenced": "combine_send_fenced", "csend_loop": "combine_send_loop",
               "csend_rows": "combine_send_rows"}
    assert [aliases.get(n, n) for n in enum] == stamps
