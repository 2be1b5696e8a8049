"""`moe-backend layer-bench`: one Megatron `MoELayer`, forward + backward, per dispatcher.

The same layer (Megatron's `TopKRouter` and experts, same seed and weights, bf16, EP over
the ranks, TP1) is built once per dispatcher - ours (`nvshmem`: the kernels, `reference`:
torch.distributed) and Megatron's own (`alltoall`, `allgather`, `flex` where DeepEP /
HybridEP imports) - and timed on two shapes: DeepSeek-like (hidden 7168, 256 experts,
top-8) and Mixtral-like (hidden 4096, 8 experts, top-2), 4096 tokens per rank.

Method (as Megatron's MoE layer perf test): the same input every iteration, routing
forced to balanced random logits (`moe_router_force_load_balancing`, re-seeded per
dispatcher, so every dispatcher sees the same routes), a barrier and a short device sleep
before each iteration, CUDA events around forward and backward; warm-up 5, measured 20;
per rank median/p10/p90, then the slowest rank. Inside the layer, CUDA events time two
windows per op:

- `dispatch` / `combine`: `dispatch_preprocess`..`dispatch_postprocess` and
  `combine_preprocess`..`combine_postprocess` (permutation + transfer, whichever side
  does it) - the window the dispatch+combine share of the layer is computed from;
- `dispatch_comm` / `combine_comm`: `token_dispatch` / `token_combine` only.

Forward windows are exact. Backward windows run from the moment the gradient of the
window's output is ready (tensor hook) to the moment the gradient of its input is ready;
autograd may run unrelated ready work in between (the router's backward for `dispatch`,
whose input is also the router's), so backward windows are upper bounds.

A dispatcher that fails is recorded with its error; the others still run.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import gc
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .bench import Clock, max_over_ranks, stats
from .cli_args import positive_int

# Order of the runs: alltoall first (the baseline of the ratios and the output check).
DISPATCHERS = ("alltoall", "nvshmem", "reference", "allgather", "flex")
OURS = ("nvshmem", "reference")
BASELINE = "alltoall"
WINDOWS = ("dispatch", "combine", "dispatch_comm", "combine_comm")
KINDS = tuple(f"{w}_{d}" for w in WINDOWS for d in ("fwd", "bwd"))


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    num_experts: int
    topk: int
    ffn: int
    tokens: int  # per rank
    note: str = ""

    def describe(self) -> str:
        return f"H={self.hidden} E={self.num_experts} top{self.topk} ffn={self.ffn} tokens/rank={self.tokens}"


# moe_ffn_hidden_size: DeepSeek-V3's is 2048; 512 keeps 128 local SequentialMLP experts'
# GEMMs modest (3*512*7168*128 = 1.4 G bf16 parameters = 2.8 GB per GPU, as much again for
# gradients). Mixtral's real 14336 fits (4 local experts: 0.7 G parameters per GPU).
SHAPES = {
    "deepseek": Shape("deepseek", 7168, 256, 8, 512, 4096,
                      "DeepSeek-V3-like; moe_ffn_hidden_size 512 (real: 2048) to keep 128 local experts modest"),
    "mixtral": Shape("mixtral", 4096, 8, 2, 14336, 4096, "Mixtral-8x7B-like; real moe_ffn_hidden_size"),
}
QUICK_SHAPES = {
    "deepseek": Shape("deepseek", 512, 16, 4, 64, 128, "--quick: tiny DeepSeek-like shape"),
    "mixtral": Shape("mixtral", 256, 4, 2, 512, 128, "--quick: tiny Mixtral-like shape"),
}


def say(msg: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"[moe-backend layer-bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- timing -----------------------------------------------------------------------------------
class Timer(Clock):
    """CUDA events (host clock on CPU) for the windows of one iteration."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.spans: list[tuple[str, Any, Any]] = []

    def ms(self, a: Any, b: Any) -> float:
        return self.elapsed_us(a, b) / 1e3

    def add(self, kind: str, start: Any, end: Any) -> None:
        self.spans.append((kind, start, end))

    def collect(self) -> dict[str, float]:
        """Milliseconds per kind since the last call (call after synchronising)."""
        out: dict[str, float] = {}
        for kind, start, end in self.spans:
            out[kind] = out.get(kind, 0.0) + self.ms(start, end)
        self.spans.clear()
        return out


def _grad_hook(tensor: Any, fn: Any) -> None:
    if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
        tensor.register_hook(lambda _grad: fn())


def instrument_window(obj: Any, first: str, last: str, window: str, timer: Timer) -> None:
    """Time `obj.first(...)` .. `obj.last(...)` forward, and its backward (instance attributes)."""
    state: dict[str, Any] = {}

    def wrap(name: str, opening: bool, closing: bool) -> None:
        orig = getattr(obj, name)

        @functools.wraps(orig)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if opening:
                span: dict[str, Any] = {}
                state["span"], state["start"] = span, timer.mark()

                def backward_done(span: dict[str, Any] = span) -> None:  # gradient of the input: end
                    if "bwd_start" in span:
                        timer.add(f"{window}_bwd", span.pop("bwd_start"), timer.mark())

                _grad_hook(args[0] if args else None, backward_done)
            out = orig(*args, **kwargs)
            if closing:
                start, span = state.pop("start", None), state.pop("span", {})
                if start is not None:
                    timer.add(f"{window}_fwd", start, timer.mark())
                first_out = out[0] if isinstance(out, tuple) else out
                _grad_hook(first_out, lambda span=span: span.__setitem__("bwd_start", timer.mark()))
            return out

        setattr(obj, name, wrapped)

    if first == last:
        wrap(first, True, True)
    else:
        wrap(first, True, False)
        wrap(last, False, True)


def instrument(dispatcher: Any, timer: Timer) -> None:
    instrument_window(dispatcher, "dispatch_preprocess", "dispatch_postprocess", "dispatch", timer)
    instrument_window(dispatcher, "combine_preprocess", "combine_postprocess", "combine", timer)
    instrument_window(dispatcher, "token_dispatch", "token_dispatch", "dispatch_comm", timer)
    instrument_window(dispatcher, "token_combine", "token_combine", "combine_comm", timer)


# -- what can run -----------------------------------------------------------------------------
def have_te() -> bool:
    try:
        from megatron.core.extensions.transformer_engine import HAVE_TE
    except ImportError:
        return False
    return bool(HAVE_TE)


def flex_backend() -> str | None:
    """Megatron's flex backend whose package imports here (DeepEP, else HybridEP), or None."""
    for pkg, backend in (("deep_ep", "deepep"), ("hybrid_ep", "hybridep")):
        if importlib.util.find_spec(pkg) is not None:
            return backend
    return None


def unavailable(name: str, cuda: bool) -> str:
    """Why `name` cannot run here ('' if it can)."""
    if not cuda:
        return "" if name == "reference" else "needs CUDA (this run is on CPU)"
    if name == "nvshmem":
        from .backends import nvshmem_available

        ok, why = nvshmem_available()
        return "" if ok else why
    if name == "flex":
        return "" if flex_backend() else "needs DeepEP or HybridEP (neither imports)"
    if name in OURS:
        try:
            import integration.megatron  # noqa: F401
        except ImportError as err:
            return f"integration.megatron does not import: {err}"
    return ""


def resolve_experts(choice: str) -> str:
    if choice == "auto":
        return "te-grouped" if have_te() else "sequential"
    if choice == "te-grouped" and not have_te():
        raise SystemExit("layer-bench: --experts te-grouped needs transformer-engine, which is not installed")
    return choice


# -- building ---------------------------------------------------------------------------------
def transformer_config(shape: Shape, opts: argparse.Namespace, dispatcher: str, ep: int, cuda: bool) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    megatron_type = dispatcher if dispatcher in ("alltoall", "allgather", "flex") else "alltoall"
    extra: dict[str, Any] = {}
    if dispatcher == "flex":
        extra["moe_flex_dispatcher_backend"] = flex_backend() or "deepep"
    return TransformerConfig(
        num_layers=1,
        hidden_size=shape.hidden,
        num_attention_heads=8,
        num_moe_experts=shape.num_experts,
        moe_router_topk=shape.topk,
        moe_ffn_hidden_size=shape.ffn,
        ffn_hidden_size=shape.ffn,
        gated_linear_unit=True,  # SwiGLU experts, as both models
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        moe_router_dtype="fp32",
        moe_router_score_function="softmax",
        moe_router_force_load_balancing=opts.routing == "balanced" and cuda,
        moe_token_dispatcher_type=megatron_type,
        tensor_model_parallel_size=1,
        expert_model_parallel_size=ep,
        sequence_parallel=False,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        use_cpu_initialization=not cuda,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        moe_permute_fusion=False,
        moe_router_fusion=False,
        moe_grouped_gemm=opts.experts == "te-grouped",
        **extra,
    )


def layer_spec(shape: Shape, opts: argparse.Namespace, dispatcher: str, cuda: bool) -> Any:
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec

    te = opts.experts == "te-grouped"
    spec = get_moe_module_spec(use_te=te, num_experts=shape.num_experts, moe_grouped_gemm=te)
    if not cuda:  # TopKRouter moves its weight to CUDA; the trainer's CPU-safe router does not
        from .training.model import cpu_safe_router

        submodules = dataclasses.replace(spec.keywords["submodules"], router=cpu_safe_router())
        spec = functools.partial(spec.func, *spec.args, **{**spec.keywords, "submodules": submodules})
    if dispatcher in OURS:
        from integration.megatron import DispatcherOptions, use_backend_dispatcher

        spec = use_backend_dispatcher(spec, DispatcherOptions(backend=dispatcher, host_tokens_per_expert=True))
    return spec


def build_layer(shape: Shape, opts: argparse.Namespace, dispatcher: str, device: torch.device) -> Any:
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.moe.moe_utils import get_default_pg_collection

    cuda = device.type == "cuda"
    torch.manual_seed(opts.seed)
    if cuda:
        model_parallel_cuda_manual_seed(opts.seed)
    config = transformer_config(shape, opts, dispatcher, dist.get_world_size(), cuda)
    layer = layer_spec(shape, opts, dispatcher, cuda)(config=config, pg_collection=get_default_pg_collection())
    layer = layer.to(device=device, dtype=torch.bfloat16)  # as Megatron's perf test (router included)
    layer.train()
    return layer


def _state_copy(layer: Any) -> dict[str, Any]:
    """The first layer's weights, kept on the host (GPU memory stays the layer's own)."""
    return {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else copy.deepcopy(v)
            for k, v in layer.state_dict().items()}


def _param_bytes(layer: Any) -> int:
    return sum(p.numel() * p.element_size() for p in layer.parameters())


# -- one dispatcher ---------------------------------------------------------------------------
def _compare(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    g, w = got.float(), want.float()
    return {
        "max_abs_diff": float((g - w).abs().max()),
        "rel_l2": float((g - w).norm() / w.norm().clamp_min(1e-30)),
    }


def _router_grad(layer: Any) -> torch.Tensor | None:
    p = dict(layer.named_parameters()).get("router.weight")
    return None if p is None or p.grad is None else p.grad.detach().clone()


def run_dispatcher(shape: Shape, opts: argparse.Namespace, dispatcher: str, device: torch.device,
                   ref: dict[str, Any]) -> dict[str, Any]:
    """Build, check against the first dispatcher's output, warm up, time. Returns this rank's record."""
    cuda = device.type == "cuda"
    rank = dist.get_rank()
    layer = build_layer(shape, opts, dispatcher, device)
    if "state" in ref:
        layer.load_state_dict(ref["state"])
    else:
        ref["state"] = _state_copy(layer)
    timer = Timer(cuda)
    instrument(layer.token_dispatcher, timer)
    gen = torch.Generator(device=device).manual_seed(opts.seed * 1000 + rank)
    x = torch.randn(shape.tokens, 1, shape.hidden, device=device, dtype=torch.bfloat16, generator=gen)
    grad = torch.randn(shape.tokens, 1, shape.hidden, device=device, dtype=torch.bfloat16, generator=gen)
    if cuda:  # the same forced-balanced routes, iteration by iteration, for every dispatcher
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(opts.seed)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    samples: dict[str, list[float]] = {}
    record: dict[str, Any] = {"status": "ok", "param_bytes_per_rank": _param_bytes(layer),
                              "layer_class": type(layer).__name__, "experts_class": type(layer.experts).__name__,
                              "dispatcher_class": type(layer.token_dispatcher).__name__}
    gc.collect()
    gc.disable()
    try:
        for it in range(opts.warmup + opts.iters):
            if it == opts.warmup and cuda:
                torch.cuda.reset_peak_memory_stats(device)
            layer.zero_grad(set_to_none=True)
            h = x.detach().requires_grad_()  # a fresh leaf: hooks never pile up
            sync()
            dist.barrier()
            if cuda:
                torch.cuda._sleep(2_000_000)  # ~1 ms: the host enqueues ahead, the events time the GPU
            timer.spans.clear()
            t0 = timer.mark()
            out = layer(h)[0]
            t1 = timer.mark()
            out.backward(grad)
            t2 = timer.mark()
            sync()
            windows = timer.collect()
            if it == 0:
                check = {"out": out.detach().clone(), "grad_input": h.grad.detach().clone(),
                         "grad_router": _router_grad(layer)}
                if "check" not in ref:
                    ref["check"], ref["check_of"] = check, dispatcher
                    record["check"] = {"baseline": dispatcher}
                else:
                    record["check"] = {"baseline": ref["check_of"], **{
                        name: _compare(check[name], ref["check"][name])
                        for name in check if check[name] is not None and ref["check"].get(name) is not None
                    }}
                del check
            if it < opts.warmup:
                continue
            for key, value in (("fwd", timer.ms(t0, t1)), ("bwd", timer.ms(t1, t2)), ("fwd_bwd", timer.ms(t0, t2)),
                               *windows.items()):
                samples.setdefault(key, []).append(value)
            del out
    finally:
        gc.enable()
    peak = torch.cuda.max_memory_allocated(device) if cuda else 0
    record["per_rank"] = {k: stats(v) for k, v in samples.items() if len(v) == opts.iters}
    record["peak_allocated_bytes"] = peak
    del layer, x, grad, h
    return record


def _release(dispatcher: str, device: torch.device) -> None:
    mod = sys.modules.get("integration.megatron")
    if dispatcher in OURS and mod is not None:
        mod.clear_cache()  # collective for nvshmem: every rank reaches it in the same order
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def finish_record(record: dict[str, Any]) -> dict[str, Any]:
    """Collective: this rank's statistics -> the slowest rank's, plus derived shares."""
    per_rank = record.pop("per_rank")
    times = max_over_ranks(per_rank)
    peaks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, record.pop("peak_allocated_bytes"))
    record["peak_allocated_gib_max_rank"] = max(peaks) / 2**30
    record["ms"] = times
    record["shares"] = shares(times)
    return record


def _median(times: dict[str, dict[str, float]], key: str) -> float:
    return times[key]["median"] if key in times else 0.0


def shares(times: dict[str, dict[str, float]]) -> dict[str, float]:
    """Dispatch+combine as a fraction of the layer (medians of the slowest rank)."""
    out: dict[str, float] = {}
    total, fwd = _median(times, "fwd_bwd"), _median(times, "fwd")
    for win, label in (("", "dispatch_combine"), ("_comm", "comm")):
        f = _median(times, f"dispatch{win}_fwd") + _median(times, f"combine{win}_fwd")
        b = _median(times, f"dispatch{win}_bwd") + _median(times, f"combine{win}_bwd")
        out[f"{label}_ms_fwd_bwd"] = f + b
        out[f"{label}_share_fwd_bwd"] = (f + b) / total if total else 0.0
        out[f"{label}_share_fwd"] = f / fwd if fwd else 0.0
    return out


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each dispatcher against alltoall: time ratio and dispatch+combine share."""
    base = results.get(BASELINE)
    if not base or base.get("status") != "ok":
        return {}
    b_total = base["ms"]["fwd_bwd"]["median"]
    b_share = base["shares"]["dispatch_combine_share_fwd_bwd"]
    out = {}
    for name, r in results.items():
        if name == BASELINE or r.get("status") != "ok":
            continue
        total, share = r["ms"]["fwd_bwd"]["median"], r["shares"]["dispatch_combine_share_fwd_bwd"]
        out[name] = {
            "fwd_bwd_ms": total,
            "alltoall_fwd_bwd_ms": b_total,
            "time_ratio": total / b_total,  # < 1: faster than alltoall
            "speedup": b_total / total,
            "fwd_ratio": r["ms"]["fwd"]["median"] / base["ms"]["fwd"]["median"],
            "bwd_ratio": r["ms"]["bwd"]["median"] / base["ms"]["bwd"]["median"],
            "dispatch_combine_share": share,
            "alltoall_dispatch_combine_share": b_share,
            "no_slower_than_alltoall": total <= b_total,
            "share_smaller_than_alltoall": share < b_share,
        }
    return out


# -- the run ----------------------------------------------------------------------------------
def _device() -> torch.device:
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _bench_body(opts: argparse.Namespace) -> None:
    from megatron.core import parallel_state as ps

    from .bench import machine_info
    from .training.cli import quiet_megatron_warnings

    quiet_megatron_warnings()
    device = _device()
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.get_world_size()))
    world = dist.get_world_size()
    shapes = [(QUICK_SHAPES if opts.quick else SHAPES)[n] for n in opts.shapes]
    shapes = [dataclasses.replace(s, tokens=opts.tokens or s.tokens, ffn=getattr(opts, f"{s.name}_ffn") or s.ffn)
              for s in shapes]
    report: dict[str, Any] = {
        "machine": {**machine_info(), "megatron_core": _version("megatron-core"),
                    "transformer_engine": have_te(), "flex_backend": flex_backend()},
        "method": {
            "layer": "megatron.core MoELayer: TopKRouter (softmax, fp32 router dtype, no aux loss) + "
                     f"{'TEGroupedMLP' if opts.experts == 'te-grouped' else 'SequentialMLP'} SwiGLU experts, "
                     "no shared experts; bf16; weights identical across dispatchers (one state dict)",
            "parallel": {"world_size": world, "expert_model_parallel": world, "tensor_parallel": 1},
            "routing": ("Megatron moe_router_force_load_balancing (random logits, re-seeded per dispatcher)"
                        if opts.routing == "balanced" and cuda else "the router's own top-k"),
            "warmup": opts.warmup, "iters": opts.iters, "quick": opts.quick,
            "timing": "CUDA events; per rank median/p10/p90 over the measured iterations, then the max over ranks",
            "windows": {
                "dispatch": "dispatch_preprocess..dispatch_postprocess (forward); backward: grad of its output "
                            "ready -> grad of its input ready (upper bound: includes the router's backward)",
                "combine": "combine_preprocess..combine_postprocess; backward likewise",
                "dispatch_comm": "token_dispatch only", "combine_comm": "token_combine only",
            },
            "share": "dispatch_combine_share_fwd_bwd = (dispatch+combine, fwd+bwd) / layer fwd+bwd, medians",
            "peak_allocated": "torch allocator only (NVSHMEM symmetric memory is not counted)",
        },
        "results": [],
    }
    avail = {name: unavailable(name, cuda) for name in DISPATCHERS}
    names = [n for n in DISPATCHERS if n in opts.dispatchers]
    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=world)
    try:
        for shape in shapes:
            entry: dict[str, Any] = {"shape": shape.name, "config": {
                **dataclasses.asdict(shape), "dtype": "bf16", "experts": opts.experts, "ep": world, "tp": 1,
                "local_experts": shape.num_experts // world}, "dispatchers": {}}
            report["results"].append(entry)
            ref: dict[str, Any] = {}
            say(f"== {shape.name}: {shape.describe()} ({shape.note})")
            for name in names:
                if avail[name]:
                    entry["dispatchers"][name] = {"status": "skipped", "reason": avail[name]}
                    say(f"{shape.name} / {name}: skipped ({avail[name]})")
                    continue
                say(f"{shape.name} / {name}: build, {opts.warmup} warm-up + {opts.iters} measured iterations")
                try:
                    record = run_dispatcher(shape, opts, name, device, ref)
                except Exception as err:  # one broken dispatcher must not hide the others' results
                    record = {"status": "error", "error": f"{type(err).__name__}: {err}",
                              "traceback": traceback.format_exc()}
                    print(f"[rank {dist.get_rank()}] {shape.name} / {name} failed:\n{record['traceback']}",
                          flush=True)
                record = _agree(record)
                _release(name, device)
                entry["dispatchers"][name] = record
                if record["status"] == "ok":
                    ms = record["ms"]["fwd_bwd"]
                    say(f"{shape.name} / {name}: fwd+bwd median {ms['median']:.2f} ms "
                        f"(p10 {ms['p10']:.2f}, p90 {ms['p90']:.2f}), dispatch+combine share "
                        f"{100 * record['shares']['dispatch_combine_share_fwd_bwd']:.1f}%")
                else:
                    say(f"{shape.name} / {name}: FAILED: {record['error'].splitlines()[0][:200]}")
                entry["vs_alltoall"] = ratios(entry["dispatchers"])
                _write(opts.out, report)  # after every dispatcher: a crash later keeps these
            ref.clear()
            _release("", device)
            say("\n" + format_table(entry))
    finally:
        _release("nvshmem", device)  # closes whatever our dispatchers left open
        ps.destroy_model_parallel()
    report["done_criterion"] = done_criterion(report)
    _write(opts.out, report)
    if opts.out:
        say(f"wrote {opts.out}")


def _agree(record: dict[str, Any]) -> dict[str, Any]:
    """Collective: if any rank failed, the record is that failure on every rank; else finish it."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, None if record["status"] == "ok" else
                           {k: record[k] for k in ("status", "error", "traceback")})
    failed = [(r, g) for r, g in enumerate(gathered) if g is not None]
    if failed:
        rank, g = failed[0]
        return {**g, "failed_ranks": [r for r, _ in failed], "error": f"rank {rank}: {g['error']}"}
    return finish_record(record)


def done_criterion(report: dict[str, Any]) -> dict[str, Any]:
    """The issue's criterion per our dispatcher: no slower than alltoall and a smaller share, on every shape."""
    out: dict[str, Any] = {}
    for name in OURS:
        per_shape = {}
        for entry in report["results"]:
            r = entry.get("vs_alltoall", {}).get(name)
            per_shape[entry["shape"]] = None if r is None else {
                "no_slower_than_alltoall": r["no_slower_than_alltoall"],
                "share_smaller_than_alltoall": r["share_smaller_than_alltoall"],
                "time_ratio": r["time_ratio"],
            }
        met = bool(per_shape) and all(v is not None and v["no_slower_than_alltoall"] and
                                      v["share_smaller_than_alltoall"] for v in per_shape.values())
        out[name] = {"met": met, "shapes": per_shape}
    return out


def _version(pkg: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _write(path: str | None, report: dict[str, Any]) -> None:
    if not path or dist.get_rank() != 0:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(p)


def format_table(entry: dict[str, Any]) -> str:
    c = entry["config"]
    lines = [f"== {entry['shape']}: H={c['hidden']} E={c['num_experts']} top{c['topk']} ffn={c['ffn']} "
             f"tokens/rank={c['tokens']} EP{c['ep']} bf16 {c['experts']} experts"]
    head = (f"{'dispatcher':<11}{'fwd ms':>9}{'bwd ms':>9}{'fwd+bwd ms':>12}{'p10-p90':>15}{'vs a2a':>8}"
            f"{'disp f/b':>14}{'comb f/b':>14}{'d+c share':>10}{'comm fwd':>9}  out vs base")
    lines += [head, "-" * len(head)]
    vs = entry.get("vs_alltoall", {})
    for name, r in entry["dispatchers"].items():
        if r["status"] != "ok":
            why = r.get("reason") or r.get("error", "").splitlines()[0]
            lines.append(f"{name:<11}  {r['status']}: {why[:110]}")
            continue
        ms, sh = r["ms"], r["shares"]

        def med(k: str, ms: dict[str, Any] = ms) -> float:
            return ms[k]["median"] if k in ms else float("nan")

        t = ms["fwd_bwd"]
        ratio = f"{vs[name]['time_ratio']:>7.3f}x" if name in vs else f"{'1.000x' if name == BASELINE else '-':>8}"
        chk = r.get("check", {})
        out_diff = f"{chk['out']['rel_l2']:.1e}" if "out" in chk else "(base)"
        lines.append(
            f"{name:<11}{med('fwd'):>9.2f}{med('bwd'):>9.2f}{t['median']:>12.2f}"
            f"{t['p10']:>7.2f}-{t['p90']:<7.2f}{ratio}"
            f"{med('dispatch_fwd'):>7.2f}/{med('dispatch_bwd'):<6.2f}{med('combine_fwd'):>7.2f}/{med('combine_bwd'):<6.2f}"
            f"{100 * sh['dispatch_combine_share_fwd_bwd']:>9.1f}%{100 * sh['comm_share_fwd']:>8.1f}%  {out_diff}")
    lines.append("(medians of the slowest rank; vs a2a: time / alltoall's; d+c share: dispatch+combine windows, "
                 "fwd+bwd, of the layer; comm fwd: token_dispatch+token_combine of the forward; out vs base: rel. L2)")
    return "\n".join(lines)


# -- command line -----------------------------------------------------------------------------
def _failed(out: str | None) -> list[str]:
    if not out or not Path(out).exists():
        return []
    report = json.loads(Path(out).read_text())
    return [f"{e['shape']}/{n}" for e in report["results"] for n, r in e["dispatchers"].items()
            if r["status"] == "error"]


def cmd_layer_bench(args: argparse.Namespace) -> int:
    from .launch import init_process_group, spawn, under_torchrun

    args.experts = resolve_experts(args.experts)
    if args.quick:
        args.warmup = 1 if args.warmup is None else args.warmup
        args.iters = 2 if args.iters is None else args.iters
    args.warmup = 5 if args.warmup is None else args.warmup
    args.iters = 20 if args.iters is None else args.iters
    if args.iters < 1 or args.warmup < 1:
        raise SystemExit("layer-bench: --iters and --warmup must be at least 1 (warm-up 0 checks outputs)")
    rank0 = os.environ.get("RANK", "0") == "0" if under_torchrun() else True
    if args.out and rank0:
        Path(args.out).unlink(missing_ok=True)  # a stale file must not pass for this run's
    if under_torchrun():
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
        init_process_group("gloo" if args.cpu or torch.cuda.device_count() < local else "nccl")
        try:
            _bench_body(args)
        finally:
            dist.destroy_process_group()
        if not rank0:
            return 0  # rank 0 reports
    else:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        backend = "gloo" if args.cpu or gpus < args.world_size else "nccl"
        say(f"starting {args.world_size} local processes ({backend})")
        spawn(_bench_body, args.world_size, args, dist_backend=backend, timeout=args.timeout)
    failed = _failed(args.out)
    if failed:
        say(f"failed: {', '.join(failed)} (errors in {args.out})")
        return 3
    return 0


def add_layer_bench_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "layer-bench", help="MoELayer forward+backward time per dispatcher (ours vs Megatron's), JSON",
        description="Time one Megatron MoELayer (forward + backward, and its dispatch/combine windows) with each "
                    "dispatcher on DeepSeek-like and Mixtral-like shapes. Exit status 3: a dispatcher failed.")
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["deepseek", "mixtral"])
    p.add_argument("--dispatchers", nargs="+", choices=DISPATCHERS, default=list(DISPATCHERS),
                   help="default: all; those that cannot run here are recorded as skipped")
    p.add_argument("--tokens", type=positive_int, help="tokens per rank (default 4096; --quick 128)")
    p.add_argument("--deepseek-ffn", type=positive_int,
                   help="moe_ffn_hidden_size of the DeepSeek-like shape (default 512)")
    p.add_argument("--mixtral-ffn", type=positive_int,
                   help="moe_ffn_hidden_size of the Mixtral-like shape (default 14336)")
    p.add_argument("--warmup", type=positive_int, help="warm-up iterations (default 5; --quick 1)")
    p.add_argument("--iters", type=positive_int, help="measured iterations (default 20; --quick 2)")
    p.add_argument("--experts", choices=["auto", "sequential", "te-grouped"], default="auto",
                   help="auto: TEGroupedMLP if transformer-engine imports, else SequentialMLP")
    p.add_argument("--routing", choices=["balanced", "router"], default="balanced",
                   help="balanced: Megatron's moe_router_force_load_balancing (its perf test's); router: top-k")
    p.add_argument("--quick", action="store_true", help="tiny shapes, 1 warm-up + 2 measured iterations (smoke)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--world-size", type=positive_int, default=2,
                   help="local processes to start (ignored under torchrun)")
    p.add_argument("--cpu", action="store_true", help="gloo on CPU, reference dispatcher only (debugging)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before the local processes are killed")
    p.add_argument("--out", default="out/layer_bench.json", help="JSON path (rewritten after every dispatcher)")
    p.set_defaults(fn=cmd_layer_bench)
