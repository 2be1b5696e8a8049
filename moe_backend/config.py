"""Typed settings loaded from YAML, in one place.

Each YAML file maps onto a dataclass tree; unknown keys, wrong types and bad values are
errors that name the file and the key (`configs/bench/x.yaml: comm.topk: ...`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from .spec import CommSpec, parse_dtype

T = TypeVar("T")


class ConfigError(ValueError):
    pass


@dataclasses.dataclass
class CommConfig:
    """The communicator's shape; `world_size` comes from the launch, not the file."""

    num_experts: int
    topk: int
    hidden: int
    max_num_tokens: int
    in_dtype: str = "bf16"
    out_dtype: str = "bf16"
    scale_block_size: int | None = None
    tp_size: int = 1
    combine_in_float32: bool = False

    def to_spec(self, world_size: int) -> CommSpec:
        return CommSpec(
            num_experts=self.num_experts,
            topk=self.topk,
            hidden=self.hidden,
            max_num_tokens=self.max_num_tokens,
            world_size=world_size,
            tp_size=self.tp_size,
            in_dtype=parse_dtype(self.in_dtype),
            out_dtype=parse_dtype(self.out_dtype),
            scale_block_size=self.scale_block_size,
            combine_in_float32=self.combine_in_float32,
        )


# The warm modes that leave the inputs cold (BenchConfig.warm_by says what each touches).
WARM_CONTROLS = ("scratch", "launch", "launch-out", "fill")
WARM_BY = ("read", "write") + WARM_CONTROLS


@dataclasses.dataclass
class BenchConfig:
    num_tokens: list[int]
    world_size: int = 2
    warmup: int = 20
    iters: int = 200
    backend: str = "auto"
    weighted: bool = False
    seed: int = 0
    # One communicator per token count with max_num_tokens = that count (a deployment sized
    # for its batch), instead of one sized by comm.max_num_tokens for all counts.
    size_each: bool = False
    # Also time dispatch send, an independent matmul of about the dispatch's length, then
    # dispatch receive, against the longer of the two alone.
    overlap: bool = False
    # Touch each timed call's inputs once before its barrier, outside the events (in a model's step
    # the layer before has just written them): off, they are cold after the barrier's device sleep.
    warm_inputs: bool = False
    # How warm_inputs touches them: "read" (each read once: clean lines in L2) or "write" (each
    # rewritten in place, its bits unchanged: dirty lines, as the kernel that made it leaves them);
    # "scratch" is the control: a scratch buffer of each input's size read instead, so the same
    # kernels run before the barrier and the inputs stay cold; "launch" the same kernels reading
    # LAUNCH_CONTROL_BYTES each (the kernels with next to nothing swept); "launch-out" the same
    # reductions into an output made once (nothing from the allocator); "fill" as many kernels
    # filling LAUNCH_CONTROL_BYTES each (no reduction: no output tensor from the allocator).
    warm_by: str = "read"

    def warm_mode(self) -> str:
        """'' (cold), 'read', 'write' or a control ('scratch', 'launch', 'launch-out', 'fill'): what `bench.barrier`
        does before a call. warm_by (always set: "read" by default) says how, only where warm_inputs
        is on."""
        return self.warm_by if self.warm_inputs else ""

    def apply_warm_flags(self, warm_inputs: bool, warm_by: str | None) -> None:
        """A command line's `--warm-inputs` / `--warm-by` (None unless given; it implies warm
        inputs) over the preset's own settings: `moe-backend bench` and kernel_timeline.py."""
        if warm_inputs or warm_by:
            self.warm_inputs = True
        if warm_by:
            self.warm_by = warm_by


@dataclasses.dataclass
class BenchPreset:
    name: str
    comm: CommConfig
    bench: BenchConfig

    def validate(self) -> None:
        too_many = [n for n in self.bench.num_tokens if not 1 <= n <= self.comm.max_num_tokens]
        if too_many:
            limit = self.comm.max_num_tokens
            raise ConfigError(f"bench.num_tokens: {too_many} not in [1, comm.max_num_tokens={limit}]")
        if self.bench.warm_by not in WARM_BY:
            raise ConfigError(f"bench.warm_by must be one of {WARM_BY}, got {self.bench.warm_by!r}")
        if self.bench.iters < 1 or self.bench.warmup < 0:
            raise ConfigError("bench.iters must be >= 1 and bench.warmup >= 0")
        for name in (self.comm.in_dtype, self.comm.out_dtype):
            try:
                parse_dtype(name)
            except ValueError as err:
                raise ConfigError(f"comm: {err}") from None
        try:
            self.comm.to_spec(self.bench.world_size)
        except ValueError as err:
            raise ConfigError(f"comm (with world_size={self.bench.world_size}): {err}") from None


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, where)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]  # a single number where a list is allowed
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if tp in (int, float, str, bool) and (type(value) is not tp):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build dataclass `cls` from a mapping, strictly."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'top level'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where + '.' if where else ''}{unknown[0]}: unknown key (expected one of {sorted(fields)})")
    kwargs = {}
    for name, f in fields.items():
        key = f"{where}.{name}" if where else name
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key}: required key is missing")
    return cls(**kwargs)


def load(path: str | Path, cls: type[T]) -> T:
    """Load and validate one YAML file as `cls`; errors name the file and the key."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
        obj = from_dict(cls, data)
        validate = getattr(obj, "validate", None)
        if validate is not None:
            validate()
        return obj
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read: {err}") from None


def load_bench(path: str | Path) -> BenchPreset:
    return load(path, BenchPreset)


def configs_dir(kind: str) -> Path:
    """The repository's `configs/<kind>` folder of named YAML presets."""
    return Path(__file__).resolve().parent.parent / "configs" / kind


def bench_presets_dir() -> Path:
    return configs_dir("bench")


def resolve_config(name: str, folder: Path) -> Path:
    """A path to a YAML file, or the name of a file in `folder` (with or without .yaml)."""
    path = Path(name)
    if path.exists():
        return path
    candidate = folder / (name if name.endswith(".yaml") else f"{name}.yaml")
    if candidate.exists():
        return candidate
    known = sorted(p.stem for p in folder.glob("*.yaml"))
    raise ConfigError(f"no config file or preset named {name!r}; presets in configs/{folder.name}: {known}")
