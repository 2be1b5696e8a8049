"""Input checks run before any communication; each error names the argument and what was expected."""

from __future__ import annotations

from typing import overload

import torch

from .padded import PaddedHandle
from .result import Handle
from .spec import FP8, CommSpec


def _is_capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def check_tensor(
    name: str,
    value: object,
    *,
    dtypes: tuple[torch.dtype, ...],
    shape: tuple[int | None, ...],
    device: torch.device,
) -> torch.Tensor:
    """Check type, dtype, rank, sizes (None = any) and device of one tensor argument."""
    # One pass over the common case (every check holds): an eager decode step is host-bound.
    if (isinstance(value, torch.Tensor) and value.dtype in dtypes and value.layout == torch.strided
            and _sizes_fit(value.shape, shape) and value.device == device):
        return value
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {value.layout}")
    if value.dtype not in dtypes:
        names = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype {names}, got {value.dtype}")
    if not _sizes_fit(value.shape, shape):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(value.shape)}")
    raise ValueError(f"{name} must be on {device}, got {value.device}")


def _sizes_fit(sizes: torch.Size, shape: tuple[int | None, ...]) -> bool:
    if len(sizes) != len(shape):
        return False
    for want, got in zip(shape, sizes):
        if want is not None and want != got:
            return False
    return True


def normalize_num_tokens(num_tokens: object, rows: int, device: torch.device) -> int | torch.Tensor:
    """`None` -> rows; an int in [0, rows]; or a one-element int tensor on the device."""
    if num_tokens is None:
        return rows
    if isinstance(num_tokens, torch.Tensor):
        # Kept in its dtype until the value checks have read it: an int64 count past int32 must
        # not wrap into range first.
        check_tensor("num_tokens", num_tokens.reshape(-1), dtypes=(torch.int32, torch.int64), shape=(1,), device=device)
        return num_tokens.reshape(1)
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
        raise TypeError(f"num_tokens must be None, an int or a 1-element tensor, got {type(num_tokens).__name__}")
    if not 0 <= num_tokens <= rows:
        raise ValueError(f"num_tokens must be in [0, {rows}] (the rows of x), got {num_tokens}")
    return num_tokens


def check_dispatch(
    spec: CommSpec,
    device: torch.device,
    x: object,
    topk_ids: object,
    topk_weights: object,
    x_scale: object,
    num_tokens: object,
    check_values: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, int | torch.Tensor]:
    """Validate dispatch's arguments; return them normalised for a backend."""
    x = check_tensor("x", x, dtypes=(spec.in_dtype,), shape=(None, spec.hidden), device=device)
    rows = x.shape[0]
    if rows > spec.max_num_tokens:
        raise ValueError(f"x has {rows} tokens, more than max_num_tokens={spec.max_num_tokens}")
    ids = check_tensor("topk_ids", topk_ids, dtypes=(torch.int32, torch.int64), shape=(rows, spec.topk), device=device)
    if topk_weights is not None:
        topk_weights = check_tensor(
            "topk_weights", topk_weights, dtypes=(torch.float32,), shape=(rows, spec.topk), device=device
        )
    if spec.in_dtype == FP8:
        if x_scale is None:
            raise ValueError(f"x_scale is required for fp8 input: float32 [{rows}, {spec.num_scales}]")
        x_scale = check_tensor(
            "x_scale", x_scale, dtypes=(torch.float32,), shape=(rows, spec.num_scales), device=device
        )
    elif x_scale is not None:
        raise ValueError(f"x_scale must be None for in_dtype {spec.in_dtype} (scales go with fp8 only)")
    _refuse_grad(x=x, topk_weights=topk_weights, x_scale=x_scale)
    n = normalize_num_tokens(num_tokens, rows, device)
    if check_values and not _is_capturing(device):
        _check_ids(spec, ids, n, rows)
    if isinstance(n, torch.Tensor) and n.dtype != torch.int32:
        n = n.clamp(0, rows).to(torch.int32)  # unchecked: clamped, as the kernels clamp, not wrapped
    if ids.dtype != torch.int32:  # a no-op .to() still costs ~2 us of host time
        ids = ids.to(torch.int32)
    return vector_aligned(x), vector_aligned(ids), vector_aligned(topk_weights), vector_aligned(x_scale), n


def _refuse_grad(**tensors: torch.Tensor | None) -> None:
    """The plain communicator is not differentiable: a tensor that wants a gradient would
    silently get none."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise ValueError(f"{name} requires grad, but Communicator is not differentiable: use moe_backend."
                             "autograd.DifferentiableCommunicator, or detach it / run under torch.no_grad()")


def _check_ids(spec: CommSpec, ids: torch.Tensor, n: int | torch.Tensor, rows: int) -> None:
    """Value checks (one host sync on GPU): range, distinctness, num_tokens bound."""
    if isinstance(n, torch.Tensor):
        n = int(n.item())
        if not 0 <= n <= rows:
            raise ValueError(f"num_tokens must be in [0, {rows}] (the rows of x), got {n}")
    live = ids[:n].long()
    bad = (live < -1) | (live >= spec.num_experts)
    if bool(bad.any()):
        t, k = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"topk_ids[{t}, {k}] = {int(live[t, k])} is out of range: expected -1 (dropped) "
            f"or an expert id in [0, {spec.num_experts})"
        )
    srt = live.sort(dim=1).values
    dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
    if bool(dup.any()):
        t = int(dup.nonzero()[0, 0])
        raise ValueError(f"topk_ids row {t} repeats an expert: {live[t].tolist()}; ids in a row must be distinct")


def check_combine(
    spec: CommSpec,
    device: torch.device,
    comm_id: int,
    current_round: int,
    expert_y: object,
    handle: object,
    weights: object,
    out: object,
) -> tuple[torch.Tensor, Handle, torch.Tensor | None, torch.Tensor | None]:
    _check_handle(handle, Handle, comm_id, current_round)
    # Backends read only rows < total; with the total known on the host those rows suffice,
    # else (no sync here) every row of the dispatch result is required.
    known = handle.host_valid_rows
    rows = handle.src_group.shape[0] if known is None else known
    what = "the dispatch result's" if known is None else "the valid rows, handle.host_valid_rows"
    expert_y = check_tensor("expert_y", expert_y, dtypes=(spec.out_dtype,), shape=(None, spec.hidden), device=device)
    if expert_y.shape[0] < rows:
        raise ValueError(f"expert_y must have at least {rows} rows ({what}), got {expert_y.shape[0]}")
    if weights is not None:
        weights = check_tensor("weights", weights, dtypes=(torch.float32,), shape=(None,), device=device)
        if weights.shape[0] < rows:
            raise ValueError(f"weights must have at least {rows} entries (one per row; {what}), got {weights.shape[0]}")
    out = _check_out(spec, device, out, handle.num_input_rows)
    _refuse_grad(expert_y=expert_y, weights=weights)
    return vector_aligned(expert_y), handle, vector_aligned(weights), out


def _check_handle(handle: object, kind: type, comm_id: int, current_round: int) -> None:
    """The handle of this communicator's latest dispatch, of the layout this combine takes."""
    if not isinstance(handle, kind):
        if isinstance(handle, (Handle, PaddedHandle)):
            want, use = ("dispatch", "combine") if isinstance(handle, Handle) else ("dispatch_padded", "combine_padded")
            raise TypeError(f"handle comes from {want}: pass it to {use}")
        raise TypeError(f"handle must be the {kind.__name__} returned by dispatch, got {type(handle).__name__}")
    if handle.comm_id != comm_id:
        raise ValueError("handle comes from another communicator; pass the handle of this communicator's dispatch")
    if handle.round != current_round:
        raise ValueError(
            f"handle is from round {handle.round} but the latest dispatch is round {current_round}; "
            "combine must use the handle of the latest dispatch"
        )


@overload
def vector_aligned(t: torch.Tensor) -> torch.Tensor: ...


@overload
def vector_aligned(t: None) -> None: ...


def vector_aligned(t: torch.Tensor | None) -> torch.Tensor | None:
    """`t` contiguous and starting on a 16-byte boundary, as the kernels' vector loads need: a view
    that starts elsewhere in its buffer (a slice at an odd offset) is copied. None stays None."""
    if t is None:
        return None
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _check_out(spec: CommSpec, device: torch.device, out: object, rows: int) -> torch.Tensor | None:
    if out is None:
        return None
    out = check_tensor("out", out, dtypes=(spec.out_dtype,), shape=(rows, spec.hidden), device=device)
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
    if out.data_ptr() % 16:
        raise ValueError("out must start on a 16-byte boundary (the kernels store whole 16-byte vectors)")
    if out.requires_grad:
        raise ValueError("out must not require grad: combine writes it in place")
    return out


def check_combine_padded(
    spec: CommSpec,
    device: torch.device,
    comm_id: int,
    current_round: int,
    expert_y: object,
    handle: object,
    weights: object,
    out: object,
) -> tuple[torch.Tensor, PaddedHandle, torch.Tensor | None, torch.Tensor | None]:
    """`expert_y [L, G * M, hidden]` and `weights [L, G * M]`, the padded dispatch's layout."""
    _check_handle(handle, PaddedHandle, comm_id, current_round)
    assert isinstance(handle, PaddedHandle)
    slots = spec.num_groups * spec.max_num_tokens
    expert_y = check_tensor("expert_y", expert_y, dtypes=(spec.out_dtype,),
                            shape=(spec.num_local_experts, slots, spec.hidden), device=device)
    if weights is not None:
        weights = check_tensor("weights", weights, dtypes=(torch.float32,), shape=(spec.num_local_experts, slots),
                               device=device)
    out = _check_out(spec, device, out, handle.num_input_rows)
    _refuse_grad(expert_y=expert_y, weights=weights)
    return vector_aligned(expert_y), handle, vector_aligned(weights), out
