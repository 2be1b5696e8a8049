"""The fixed shape of one communicator: sizes and dtypes, validated in one place.

A `CommSpec` is immutable and hashable: it is the key of the buffer arena, and every
backend derives its buffer sizes from it.
"""

from __future__ import annotations

import dataclasses

import torch

FP8 = torch.float8_e4m3fn
INT32_MAX = 2**31 - 1
IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32, FP8)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

_DTYPE_NAMES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp8": FP8,
    "fp8_e4m3": FP8,
    "float8_e4m3fn": FP8,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """Accept a torch dtype or one of the short names used in configs ('bf16', 'fp8', ...)."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPE_NAMES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPE_NAMES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", FP8: "fp8"}[dtype]


@dataclasses.dataclass(frozen=True)
class CommSpec:
    """Everything fixed at construction of a communicator (see docs/CONTRACT.md)."""

    num_experts: int
    topk: int
    hidden: int
    max_num_tokens: int
    world_size: int
    tp_size: int = 1
    in_dtype: torch.dtype = torch.bfloat16
    out_dtype: torch.dtype = torch.bfloat16
    scale_block_size: int | None = None
    combine_in_float32: bool = False

    def __post_init__(self) -> None:
        for name in ("num_experts", "topk", "hidden", "max_num_tokens", "world_size", "tp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
            if value > INT32_MAX:  # row ids, token ids and expert ids travel as int32
                raise ValueError(f"{name}={value} exceeds {INT32_MAX} (ids are int32)")
        if self.num_experts % self.world_size:
            raise ValueError(
                f"num_experts={self.num_experts} must be divisible by the group size "
                f"{self.world_size} (experts are split evenly over ranks)"
            )
        if self.topk > self.num_experts:
            raise ValueError(f"topk={self.topk} must be <= num_experts={self.num_experts}")
        if self.world_size % self.tp_size:
            raise ValueError(
                f"tp_size={self.tp_size} must divide the group size {self.world_size}"
            )
        if self.in_dtype not in IN_DTYPES:
            raise ValueError(f"in_dtype must be one of {IN_DTYPES}, got {self.in_dtype}")
        if self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"out_dtype must be one of {OUT_DTYPES}, got {self.out_dtype}")
        if self.in_dtype == FP8:
            block = self.scale_block_size
            if not isinstance(block, int) or isinstance(block, bool) or block < 1 or self.hidden % block:
                raise ValueError(
                    f"fp8 input needs scale_block_size dividing hidden={self.hidden}, "
                    f"got {block!r}"
                )
        elif self.scale_block_size is not None:
            raise ValueError("scale_block_size is only meaningful with in_dtype fp8")
        if not isinstance(self.combine_in_float32, bool):
            raise ValueError(f"combine_in_float32 must be True or False, got {self.combine_in_float32!r}")
        rows = self.max_recv_tokens
        if rows > INT32_MAX:
            raise ValueError(f"a rank may receive {rows} rows (groups x max_num_tokens x min(topk, local experts)), "
                             f"more than {INT32_MAX}: the received rows are indexed by int32")

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.world_size

    @property
    def num_groups(self) -> int:
        """DP groups: sets of `tp_size` consecutive ranks holding the same tokens."""
        return self.world_size // self.tp_size

    @property
    def num_scales(self) -> int:
        return self.hidden // self.scale_block_size if self.in_dtype == FP8 else 0

    @property
    def expert_capacity(self) -> int:
        """The most rows one local expert can receive in one call (one per source token)."""
        return self.num_groups * self.max_num_tokens

    @property
    def max_recv_tokens(self) -> int:
        """The most rows one rank can receive in one call."""
        return self.expert_capacity * min(self.topk, self.num_local_experts)

    @property
    def transfer_dtype(self) -> torch.dtype:
        """Dtype of the per-rank partial sums that combine sends back."""
        return torch.float32 if self.combine_in_float32 else self.out_dtype

    def describe(self) -> str:
        scale = f"+scales/{self.scale_block_size}" if self.in_dtype == FP8 else ""
        return (
            f"E={self.num_experts} top{self.topk} H={self.hidden} M={self.max_num_tokens} "
            f"W={self.world_size} tp={self.tp_size} "
            f"{dtype_name(self.in_dtype)}{scale}->{dtype_name(self.out_dtype)}"
        )
