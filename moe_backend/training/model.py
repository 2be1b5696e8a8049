"""Build a megatron-core `GPTModel` with MoE layers from a `TrainConfig`.

Local (non-Transformer-Engine) spec, with two device-neutral swaps so the same model runs
on CPU (gloo) and GPU: a router whose gating does not move its weight to CUDA, and a core
attention on `torch.nn.functional.scaled_dot_product_attention` (Megatron's local
attention takes its scratch buffer from CUDA). The dispatcher is chosen by name
(`dispatchers.py`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from ..train_config import TrainConfig


def cpu_safe_router() -> type:
    from megatron.core.transformer.moe.moe_utils import router_gating_linear
    from megatron.core.transformer.moe.router import TopKRouter

    class DeviceNeutralRouter(TopKRouter):
        """TopKRouter whose gating uses the weight where it is (the base moves it to CUDA)."""

        def gating(self, input: torch.Tensor) -> torch.Tensor:
            dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(self.config.moe_router_dtype, input.dtype)
            return router_gating_linear(input, self.weight, self.bias, dtype)

    return DeviceNeutralRouter


def sdpa_attention() -> type:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class SDPAAttention(DotProductAttention):
        """Causal attention through torch SDPA; takes and returns Megatron's [s, b, ...] layout."""

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            if packed_seq_params is not None or attention_bias is not None:
                raise ValueError("SDPAAttention supports neither packed sequences nor attention bias")
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
            p = self.config.attention_dropout if self.training else 0.0
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, dropout_p=p, is_causal=True, scale=self.softmax_scale, enable_gqa=q.shape[1] != k.shape[1]
            )
            return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)

    return SDPAAttention


def transformer_config(cfg: TrainConfig, megatron_dispatcher: str) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    m, p = cfg.model, cfg.parallel
    bf16 = cfg.train.precision == "bf16"
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        ffn_hidden_size=m.moe_ffn_hidden_size,
        num_moe_experts=m.num_experts,
        moe_router_topk=m.topk,
        moe_ffn_hidden_size=m.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=m.shared_expert_hidden_size,
        moe_router_score_function=m.router_score_function,
        # One expert a token (Switch): the softmax must come before the top-1, or every weight
        # is 1.0 and the router gets no gradient (megatron-core refuses that combination).
        moe_router_pre_softmax=m.topk == 1 and m.router_score_function == "softmax",
        moe_router_load_balancing_type="aux_loss" if m.aux_loss_coeff > 0 else "none",
        moe_aux_loss_coeff=m.aux_loss_coeff,
        moe_router_dtype="fp32",
        moe_token_dispatcher_type=megatron_dispatcher,
        normalization=m.normalization,
        gated_linear_unit=m.swiglu,
        activation_func=torch.nn.functional.silu if m.swiglu else torch.nn.functional.gelu,
        init_method_std=m.init_method_std,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=p.tp,
        expert_model_parallel_size=p.ep,
        expert_tensor_parallel_size=p.expert_tp,
        sequence_parallel=p.tp > 1,  # MoELayer refuses to train with TP > 1 without it
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        pipeline_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_cpu_initialization=True,  # same init on CPU and GPU, independent of the RNG tracker
        gradient_accumulation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        moe_permute_fusion=False,
        moe_router_fusion=False,
    )


def layer_spec(cfg: TrainConfig) -> Any:
    """The local GPT layer spec (every layer MoE) with the device-neutral router and attention."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(num_experts=cfg.model.num_experts, normalization=cfg.model.normalization)
    spec.submodules.self_attention.submodules.core_attention = sdpa_attention()
    mlp = spec.submodules.mlp
    if not isinstance(mlp, functools.partial) or "submodules" not in mlp.keywords:
        raise RuntimeError(f"unexpected MoE spec in this megatron-core: {mlp!r}")
    submodules = dataclasses.replace(mlp.keywords["submodules"], router=cpu_safe_router())
    spec.submodules.mlp = functools.partial(mlp.func, *mlp.args, submodules=submodules)
    return spec


def build_gpt(cfg: TrainConfig, tconfig: Any, spec: Any, device: torch.device) -> torch.nn.Module:
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel

    m = cfg.model
    model = GPTModel(
        config=tconfig,
        transformer_layer_spec=spec,
        vocab_size=m.vocab_size,
        max_sequence_length=m.seq_length,
        position_embedding_type=m.position_embedding,
        share_embeddings_and_output_weights=True,
    )
    # Same seed on every rank gives identical replicas of the dense weights; experts are
    # re-drawn per expert-parallel rank so that rank r's experts differ from rank 0's.
    gen = torch.Generator().manual_seed(cfg.train.seed * 1000 + 17 + parallel_state.get_expert_model_parallel_rank())
    with torch.no_grad():
        for param in expert_params(model):
            param.copy_(torch.randn(param.shape, generator=gen) * m.init_method_std)
    if cfg.train.precision == "bf16":
        # As Megatron's Float16Module: every weight in bf16 (some modules, e.g. torch norms,
        # ignore params_dtype); fp32 master copies live in the optimizer.
        model = model.bfloat16()
    return model.to(device)


def expert_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters sharded over expert parallelism (Megatron marks them `allreduce=False`)."""
    return [p for p in model.parameters() if not getattr(p, "allreduce", True)]


def moe_layers(model: torch.nn.Module) -> list[Any]:
    from megatron.core.transformer.moe.moe_layer import MoELayer

    return [mod for mod in model.modules() if isinstance(mod, MoELayer)]
