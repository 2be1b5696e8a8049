"""Our Megatron dispatcher vs Megatron's own alltoall dispatcher on W GPUs (NCCL; W =
MOE_TEST_WORLD, default 2).

Same MoELayer weights (stock TopKRouter, SequentialMLP experts, fp32), same input: outputs
and every gradient (input, router, experts) must agree to float32 tolerance. Cases: EP over
all W ranks, and TP2 (expert-TP2, sequence parallelism) with EP W/2. Backends: reference,
and nvshmem when its extension loads; host and device `tokens_per_expert`.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from moe_backend import launch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _workers  # noqa: E402

pytestmark = pytest.mark.gpu

WORLD = _workers.gpu_world()
if torch.cuda.device_count() < WORLD:
    pytest.skip(f"needs {WORLD} CUDA GPUs (MOE_TEST_WORLD)", allow_module_level=True)
pytest.importorskip("megatron.core", reason="megatron-core is not importable")

S, B, H, E, TOPK, FFN = 64, 2, 128, 8, 2, 256


def _close(actual, expected, what: str, **tol) -> None:
    """assert_close whose failure message names the check (bound now, not at call time)."""
    torch.testing.assert_close(actual, expected, msg=lambda m, what=what: f"{what}: {m}", **tol)


def _layers(tp: int, ep: int, backend: str, host_counts: bool):
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.moe.moe_utils import get_default_pg_collection
    from megatron.core.transformer.transformer_config import TransformerConfig

    from integration.megatron import DispatcherOptions, clear_cache, use_backend_dispatcher

    ps.destroy_model_parallel()
    clear_cache()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, expert_model_parallel_size=ep)
    model_parallel_cuda_manual_seed(123)
    config = TransformerConfig(
        num_layers=1, hidden_size=H, num_attention_heads=4, num_moe_experts=E, moe_router_topk=TOPK,
        moe_ffn_hidden_size=FFN, ffn_hidden_size=FFN, add_bias_linear=False,
        tensor_model_parallel_size=tp, expert_model_parallel_size=ep, sequence_parallel=tp > 1,
        moe_token_dispatcher_type="alltoall", params_dtype=torch.float32, moe_router_dtype="fp32",
    )
    pg = get_default_pg_collection()
    spec = get_moe_module_spec(use_te=False, num_experts=E, moe_grouped_gemm=False)
    stock = spec(config=config, pg_collection=pg).cuda()
    ours_spec = use_backend_dispatcher(spec, DispatcherOptions(backend=backend, host_tokens_per_expert=host_counts))
    ours = ours_spec(config=config, pg_collection=pg).cuda()
    ours.load_state_dict(stock.state_dict())
    return stock, ours


def _run(layer, x: torch.Tensor, grad: torch.Tensor):
    x = x.clone().requires_grad_()
    out = layer(x)[0]
    out.backward(grad)
    grads = {name: p.grad.clone() for name, p in layer.named_parameters() if p.grad is not None}
    layer.zero_grad(set_to_none=True)
    return out.detach(), x.grad, grads


def _parity(tp: int, ep: int, backend: str, host_counts: bool) -> None:
    import torch.distributed as dist

    stock, ours = _layers(tp, ep, backend, host_counts)
    gen = torch.Generator(device="cuda").manual_seed(1000 + dist.get_rank())
    for step in range(3):  # repeated rounds reuse the cached communicators
        x = torch.randn(S // tp, B, H, device="cuda", generator=gen)
        grad = torch.randn(S // tp, B, H, device="cuda", generator=gen)
        want_out, want_gx, want_grads = _run(stock, x, grad)
        out, gx, grads = _run(ours, x, grad)
        where = f"tp={tp} ep={ep} {backend} host={host_counts} step={step} rank={dist.get_rank()}"
        _close(out, want_out, f"{where} out", atol=1e-5, rtol=1e-4)
        _close(gx, want_gx, f"{where} grad x", atol=1e-5, rtol=1e-4)
        assert grads.keys() == want_grads.keys(), where
        for name in grads:
            _close(grads[name], want_grads[name], f"{where} grad {name}", atol=1e-5, rtol=1e-4)


def _backends() -> list[str]:
    from moe_backend.backends import nvshmem_available

    return ["reference"] + (["nvshmem"] if nvshmem_available()[0] else [])


def _worker(tp: int, ep: int) -> None:
    for backend in _backends():
        # Device counts leave the static trailing rows of nvshmem's result in place, which
        # SequentialMLP's torch.split cannot take; with reference the rows are exact.
        for host_counts in (True, False) if backend == "reference" else (True,):
            _parity(tp, ep, backend, host_counts)


@pytest.mark.parametrize("tp,ep", [(1, WORLD), (2, WORLD // 2)], ids=[f"ep{WORLD}", f"expert_tp2_ep{WORLD // 2}"])
def test_parity_with_megatron_alltoall(tp: int, ep: int) -> None:
    launch.spawn(_worker, WORLD, tp, ep, dist_backend="nccl", timeout=150 * WORLD)
