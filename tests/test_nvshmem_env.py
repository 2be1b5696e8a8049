"""The nvshmem backend's MOE_BACKEND_NVSHMEM_* variables: every one the code reads is known, and
an unknown name or a value its reader would not take is refused before an arena is made."""

import re
from pathlib import Path

import pytest
import torch

from moe_backend import FP8
from moe_backend.backends import nvshmem_env
from moe_backend.backends import nvshmem_runtime as rt
from moe_backend.backends.nvshmem_env import KNOWN, PREFIX, check_env
from moe_backend.backends.nvshmem_runtime import Arena
from moe_backend.spec import CommSpec

ROOT = Path(__file__).resolve().parents[1]


def _names_in(paths: list[Path]) -> set[str]:
    return {m for p in paths for m in re.findall(PREFIX + r"([A-Z0-9_]+)", p.read_text())}


def test_every_variable_the_code_reads_is_known_and_no_other() -> None:
    code = [*ROOT.glob("csrc/*.cu"), *ROOT.glob("csrc/*.cuh"), *ROOT.glob("moe_backend/**/*.py")]
    scripts = [*ROOT.glob("scripts/**/*.sh"), *ROOT.glob("scripts/**/*.sbatch")]
    read = _names_in([p for p in code if p.name != "nvshmem_env.py"])
    assert read - KNOWN == set(), "read by the code but unknown to nvshmem_env"
    assert KNOWN - read - _names_in(scripts) == set(), "known to nvshmem_env but read nowhere"
    switches = set(re.findall(r'env_switch\(\s*"' + PREFIX + r'(\w+)"', (ROOT / "csrc/moe_kernels.cu").read_text()))
    assert switches == set(nvshmem_env.SWITCHES)


def test_every_switch_off_by_default_can_be_turned_on() -> None:
    """`env_switch(name, false)` without `can_force` ignores `name=1`: such a switch could never
    be turned on (round 64's `TWO_PART_RECV` was, until session 47: its tests and A/B ran the
    default). Off by default means forceable."""
    code = (ROOT / "csrc/moe_kernels.cu").read_text()
    calls = re.findall(r'env_switch\(\s*"' + PREFIX + r'(\w+)"\s*,\s*([^;]*?)\)\s*(?:[;?&|)]|$)', code)
    assert len(calls) >= 20, calls
    stuck = [name for name, args in calls if args.split(",")[0].strip() == "false" and "true" not in args]
    assert stuck == [], f"off by default and not forceable: {stuck}"


def test_known_values_pass() -> None:
    env = {PREFIX + name: value for name, value in zip(sorted(nvshmem_env.SWITCHES), "01" * 32)}
    env |= {PREFIX + "CE_CHUNKS": "3", PREFIX + "COPY_PIECES": "", PREFIX + "LL_COMBINE": "20",
            PREFIX + "PRESET": "ibgda", "MOE_BACKEND_OTHER": "x", "PATH": "/bin"}
    check_env(env)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("WHOLE_COMBINE", "off", "WHOLE_COMBINE must be 0 or 1, got 'off'"),
    ("SELF_SEND", "2", "SELF_SEND must be 0 or 1"),
    ("PDL", " 1", "PDL must be 0 or 1"),
    ("CE_STREAMS", "two", "CE_STREAMS must be a positive integer, got 'two'"),
    ("COPY_PIECES", "0", "COPY_PIECES must be a positive integer"),
    ("WHOLE_COMBIN", "0", "did you mean MOE_BACKEND_NVSHMEM_WHOLE_COMBINE"),
    ("FOLD_COPY", "1", "FOLD_COPY is not a variable of the nvshmem backend"),
])
def test_bad_names_and_values_are_refused(name: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_env({PREFIX + name: value})


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(ValueError) as err:
        check_env({PREFIX + "OVERLAP": "yes", PREFIX + "CE_CHUNKS": "-1", PREFIX + "PLAN_VEC": "1"})
    assert "OVERLAP must be 0 or 1" in str(err.value) and "CE_CHUNKS must be a positive integer" in str(err.value)
    assert "PLAN_VEC" not in str(err.value)


def test_an_arena_is_refused_before_anything_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check runs first in Arena: on this CPU machine the extension is never reached."""
    monkeypatch.setenv(PREFIX + "WIDE_RECV", "true")
    spec = CommSpec(8, 2, 64, 4, 1)
    with pytest.raises(ValueError, match="WIDE_RECV must be 0 or 1"):
        Arena(None, spec, "nvlink", 1.0, [0], 0, torch.device("cpu"), 1)


def test_padded_kernels_serve_only_where_they_can(monkeypatch) -> None:
    """The padded kernels' limits, each named; elsewhere the communicator derives the layout."""
    deepseek = CommSpec(256, 8, 7168, 128, 2, in_dtype=FP8, scale_block_size=128)
    assert rt.padded_unsupported(deepseek, "nvlink") is None
    assert "nvlink transport only" in rt.padded_unsupported(deepseek, "put")
    assert "16 bytes" in rt.padded_unsupported(CommSpec(8, 2, 36, 16, 2), "nvlink")  # bf16 rows of 72 bytes
    assert "topk > 32" in rt.padded_unsupported(CommSpec(64, 33, 64, 16, 2), "nvlink")
    assert "shared memory" in rt.padded_unsupported(CommSpec(1024, 8, 64, 8192, 2), "nvlink")
    monkeypatch.setenv(PREFIX + "PADDED", "0")
    assert rt.padded_unsupported(deepseek, "nvlink") == PREFIX + "PADDED=0"
    monkeypatch.setenv(PREFIX + "PADDED", "yes")
    with pytest.raises(ValueError, match="PADDED must be 0 or 1"):
        rt.padded_unsupported(deepseek, "nvlink")


def test_padded_partials_switch(monkeypatch) -> None:
    """PADDED_PARTIALS (rounds 66-67): on unless 0; any other value refused, naming it."""
    monkeypatch.delenv(PREFIX + "PADDED_PARTIALS", raising=False)
    assert rt.padded_partials() is True
    monkeypatch.setenv(PREFIX + "PADDED_PARTIALS", "0")
    assert rt.padded_partials() is False
    monkeypatch.setenv(PREFIX + "PADDED_PARTIALS", "1")
    assert rt.padded_partials() is True
    monkeypatch.setenv(PREFIX + "PADDED_PARTIALS", "on")
    with pytest.raises(ValueError, match="PADDED_PARTIALS must be 0 or 1, got 'on'"):
        rt.padded_partials()
