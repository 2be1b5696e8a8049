"""The Megatron dispatcher on CPU (gloo): Megatron's own dispatcher checks applied to ours,
and a full MoELayer (SequentialMLP experts, a CPU router) against a dense reference.

Megatron imports are slow on the 2-core CI box, so each world size is one spawn running
several checks; each check names itself in its failure message.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
import torch.distributed as dist

from moe_backend.launch import spawn

megatron = pytest.importorskip("megatron.core", reason="megatron-core is not importable")

S, B, H, E, TOPK, FFN = 6, 2, 8, 4, 2, 12


def _close(actual, expected, what: str, **tol) -> None:
    """assert_close whose failure message names the check (bound now, not at call time)."""
    torch.testing.assert_close(actual, expected, msg=lambda m, what=what: f"{what}: {m}", **tol)


# -- Megatron setup ---------------------------------------------------------------------------
def _init(tp: int, ep: int, etp: int | None = None):
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.moe.moe_utils import get_default_pg_collection

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
        create_gloo_process_groups=False,
    )
    return get_default_pg_collection()


def _config(tp: int, ep: int, etp: int | None = None, sp: bool | None = None, **overrides):
    from megatron.core.transformer.transformer_config import TransformerConfig

    overrides = {"moe_token_dispatcher_type": "alltoall", **overrides}
    return TransformerConfig(
        num_layers=1, hidden_size=H, num_attention_heads=2, num_moe_experts=E, moe_router_topk=TOPK,
        moe_ffn_hidden_size=FFN, ffn_hidden_size=FFN, add_bias_linear=False, use_cpu_initialization=True,
        tensor_model_parallel_size=tp, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
        sequence_parallel=(tp > 1) if sp is None else sp,
        bf16=False, params_dtype=torch.float32, **overrides,
    )


# Backend options of the dispatchers built by `_dispatcher` (a worker may switch them).
_BACKEND_OPTIONS: tuple[tuple[str, object], ...] = ()


def _dispatcher(config, pg, **options):
    from integration.megatron import DispatcherOptions, MoEBackendTokenDispatcher

    ep_rank, L = dist.get_rank(pg.ep), E // dist.get_world_size(pg.ep)
    opts = DispatcherOptions(backend="reference", backend_options=_BACKEND_OPTIONS, **options)
    return MoEBackendTokenDispatcher(L, [ep_rank * L + i for i in range(L)], config, pg, opts)


def _random_routing(seed: int, tokens: int):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, E, generator=gen)
    idx = logits.topk(TOPK, dim=1).indices
    routing_map = torch.zeros(tokens, E, dtype=torch.bool).scatter_(1, idx, True)
    return logits, routing_map


def _round_trip(disp, x: torch.Tensor, routing_map, probs, check: str):
    """Megatron's six steps with 'experts' scaling each row by permuted prob * (1 + global expert)."""
    hidden, p = disp.dispatch_preprocess(x, routing_map, probs)
    hidden, p = disp.token_dispatch(hidden, p)
    tokens, tpe, pprobs = disp.dispatch_postprocess(hidden, p)
    assert tokens.shape[0] == pprobs.shape[0], check
    counts = tpe.tolist()
    valid = sum(counts)
    # Device counts with static shapes (the GPU backend) leave unused rows at the end.
    static = bool(_BACKEND_OPTIONS) and "device-counts" in check
    if static:  # the padding rows must really be there, or this variant tests nothing
        assert valid < tokens.shape[0], f"{check}: expected static rows past {valid}, got {tokens.shape[0]}"
    else:
        assert valid == tokens.shape[0], f"{check}: tokens_per_expert {counts} vs {tokens.shape[0]} rows"
    scale = torch.cat([torch.full((c,), 1.0 + g) for c, g in zip(counts, disp.local_expert_indices)])
    # Experts also run on the unused rows (garbage in, garbage out): combine must ignore them.
    y = torch.cat([tokens[:valid] * (pprobs[:valid] * scale)[:, None], tokens[valid:]])
    out = disp.combine_postprocess(disp.token_combine(disp.combine_preprocess(y)))
    return out, tpe


def _dense_round_trip(x, routing_map, probs, etp: int):
    scale = (probs * routing_map * (1.0 + torch.arange(E))).sum(1)
    return etp * x * scale.view(*x.shape[:-1], 1)


def _check_round_trips(tp: int, ep: int, etp: int | None, sp: bool | None, replicas: int) -> None:
    from megatron.core.transformer.moe.moe_utils import apply_router_token_dropping

    pg = _init(tp, ep, etp)
    etp_size = dist.get_world_size(pg.expt_tp)
    tp_rank = dist.get_rank(pg.tp)
    # Sequence parallel: each rank its own tokens; replicas: the TP peers pass the same tokens.
    seed = dist.get_rank() if replicas == 1 else dist.get_rank() - tp_rank
    for mode, overrides, options in [
        ("dropless", {}, {}),
        ("dropless-device-counts", {}, {"host_tokens_per_expert": False}),
        ("capacity", {"moe_expert_capacity_factor": 0.5}, {}),
        ("drop-and-pad", {"moe_expert_capacity_factor": 0.5, "moe_pad_expert_input_to_capacity": True}, {}),
        ("router-padding", {}, {"pad_multiple": 16}),
    ]:
        config = _config(tp, ep, etp, sp, **overrides)
        disp = _dispatcher(config, pg, **options)
        assert disp.mapping.replicas == replicas, (mode, disp.mapping)
        check = f"{mode} tp={tp} ep={ep} etp={etp_size} rank={dist.get_rank()}"
        gen = torch.Generator().manual_seed(100 + seed)
        x = torch.randn(S, B, H, generator=gen).requires_grad_()
        logits, routing_map = _random_routing(seed, S * B)
        probs = (routing_map.float() / TOPK).requires_grad_()  # Megatron's test: probs 1/topk
        if overrides.get("moe_expert_capacity_factor"):
            probs_in, routing_map = apply_router_token_dropping(
                torch.softmax(logits, 1) * routing_map, routing_map, TOPK, 0.5,
                pad_to_capacity=overrides.get("moe_pad_expert_input_to_capacity", False),
            )
            probs = probs_in.detach().requires_grad_()
        out, tpe = _round_trip(disp, x, routing_map, probs, check)
        # No value checks of the router's ids (host syncs) in forward or backward by default.
        assert not disp._ex.comm.check_inputs and not disp._ex.grad_comm.check_inputs, check
        x_ref = x.detach().clone().requires_grad_()
        probs_ref = probs.detach().clone().requires_grad_()
        want = _dense_round_trip(x_ref, routing_map, probs_ref, etp_size)
        _close(out, want, f"{check} output")
        grad = torch.randn(out.shape, generator=gen)
        out.backward(grad)
        want.backward(grad)
        _close(x.grad, x_ref.grad, f"{check} grad x")
        _close(probs.grad, probs_ref.grad, f"{check} grad probs")
        if mode == "dropless-device-counts":
            assert tpe.dtype == torch.int64 and tpe.shape == (disp.num_local_experts,), check
        if mode == "capacity":
            assert (routing_map.sum(1) < TOPK).any(), f"{check}: capacity dropped nothing; test is vacuous"
        if mode == "drop-and-pad":
            groups = dist.get_world_size(pg.tp_ep) // replicas
            from megatron.core.transformer.moe.moe_utils import get_capacity

            cap = get_capacity(S * B * TOPK, E, 0.5) * groups
            assert tpe.tolist() == [cap] * disp.num_local_experts, f"{check}: {tpe.tolist()} != {cap}"
        if mode == "router-padding":
            assert all(c % 16 == 0 for c in tpe.tolist()), f"{check}: {tpe.tolist()}"


def _identity_round_trip(tp: int, ep: int, etp: int | None, sp: bool | None) -> None:
    """Megatron's dropless check verbatim: probs 1/topk, experts multiply by permuted probs only."""
    pg = _init(tp, ep, etp)
    etp_size = dist.get_world_size(pg.expt_tp)
    disp = _dispatcher(_config(tp, ep, etp, sp), pg)
    seed = dist.get_rank() if disp.mapping.replicas == 1 else dist.get_rank() - dist.get_rank(pg.tp)
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(seed)).requires_grad_()
    _, routing_map = _random_routing(seed, S * B)
    probs = (routing_map.float() / TOPK / etp_size).requires_grad_()  # shards' partials sum to 1
    hidden, p = disp.dispatch_preprocess(x, routing_map, probs)
    hidden, p = disp.token_dispatch(hidden, p)
    tokens, tpe, pprobs = disp.dispatch_postprocess(hidden, p)
    y = tokens * pprobs[:, None]
    out = disp.combine_postprocess(disp.token_combine(disp.combine_preprocess(y)))
    _close(out, x, f"identity round trip rank {dist.get_rank()}")
    out.backward(x.detach())
    _close(x.grad, x.detach(), f"identity backward rank {dist.get_rank()}")
    assert probs.grad is not None and probs.grad[routing_map].abs().sum() > 0


# -- a full MoELayer against a dense reference -------------------------------------------------
class CPURouter(torch.nn.Module):
    """Top-k softmax router on CPU (Megatron's TopKRouter moves its weight to CUDA)."""

    def __init__(self, config, pg_collection=None, is_mtp_layer=False):
        super().__init__()
        gen = torch.Generator().manual_seed(1234)  # replicated on every rank
        self.weight = torch.nn.Parameter(torch.randn(config.num_moe_experts, config.hidden_size, generator=gen))
        self.topk = config.moe_router_topk

    def set_layer_number(self, layer_number: int) -> None:
        pass

    def forward(self, x: torch.Tensor, padding_mask=None):
        logits = x.reshape(-1, x.shape[-1]) @ self.weight.t()
        vals, idx = logits.topk(self.topk, dim=1)
        probs = torch.zeros_like(logits).scatter(1, idx, torch.softmax(vals, dim=1))
        return probs, torch.zeros_like(logits, dtype=torch.bool).scatter(1, idx, True)


def _layer_spec():
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec

    from integration.megatron import DispatcherOptions, use_backend_dispatcher

    spec = get_moe_module_spec(use_te=False, num_experts=E, moe_grouped_gemm=False)
    submodules = dataclasses.replace(spec.keywords["submodules"], router=CPURouter)
    layer = functools.partial(spec.func, submodules=submodules)
    return use_backend_dispatcher(layer, DispatcherOptions(backend="reference"))


def _gather_experts(layer, pg) -> tuple[torch.Tensor, torch.Tensor]:
    """Full [E, FFN, H] fc1 and [E, H, FFN] fc2 weights assembled from every (ep, etp) shard."""
    ep_rank, etp_rank = dist.get_rank(pg.ep), dist.get_rank(pg.expt_tp)
    etp = dist.get_world_size(pg.expt_tp)
    L = len(layer.experts.local_experts)
    mine = [(ep_rank, etp_rank, e.linear_fc1.weight.detach(), e.linear_fc2.weight.detach())
            for e in layer.experts.local_experts]
    every: list = [None] * dist.get_world_size(pg.tp_ep)
    dist.all_gather_object(every, mine, group=pg.tp_ep)
    w1 = torch.zeros(E, FFN, H)
    w2 = torch.zeros(E, H, FFN)
    part = FFN // etp
    for shard in every:
        for i, (ep_r, etp_r, a, b) in enumerate(shard):
            w1[ep_r * L + i, etp_r * part : (etp_r + 1) * part] = a
            w2[ep_r * L + i, :, etp_r * part : (etp_r + 1) * part] = b
    return w1, w2


def _check_layer(tp: int, ep: int, etp: int | None, sp: bool | None, train: bool) -> None:
    from integration.megatron import MoEBackendLayer, clear_cache
    from integration.megatron.cache import cached

    pg = _init(tp, ep, etp)
    clear_cache()
    config = _config(tp, ep, etp, sp)
    torch.manual_seed(7 + dist.get_rank(pg.tp_ep))
    spec = _layer_spec()
    layers = [spec(config=config, pg_collection=pg) for _ in range(2)]
    assert all(isinstance(layer, MoEBackendLayer) for layer in layers)
    assert config.moe_token_dispatcher_type == "alltoall", "the saved dispatcher type must stay stock"
    tp_rank, replicas = dist.get_rank(pg.tp), layers[0].token_dispatcher.mapping.replicas
    seed = dist.get_rank() if replicas == 1 else dist.get_rank() - tp_rank
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(50 + seed)).requires_grad_()
    grad = torch.randn(S, B, H, generator=torch.Generator().manual_seed(60 + seed))
    for layer in layers:
        layer.train(train)
    out = layers[1](layers[0](x)[0])[0]
    assert cached() == 1, f"both layers and both passes must share one communicator pair, got {cached()}"
    out.backward(grad)

    # Dense reference of both layers on this rank's tokens, every expert computed locally.
    weights = [_gather_experts(layer, pg) for layer in layers]
    xr = x.detach().clone().requires_grad_()
    routers = [layer.router.weight.detach().clone().requires_grad_() for layer in layers]
    w_leaf = [(a.clone().requires_grad_(), b.clone().requires_grad_()) for a, b in weights]
    h = xr.reshape(-1, H)
    for wr, (w1, w2) in zip(routers, w_leaf):
        logits = h @ wr.t()
        vals, idx = logits.topk(TOPK, dim=1)
        probs = torch.softmax(vals, dim=1)
        act = config.activation_func
        out_rows = torch.zeros_like(h)
        for k in range(TOPK):
            e = idx[:, k]
            inter = act(torch.einsum("th,tfh->tf", h, w1[e])) * probs[:, k : k + 1]
            out_rows = out_rows + torch.einsum("tf,thf->th", inter, w2[e])
        h = out_rows
    want = h.view(S, B, H)
    check = f"layer tp={tp} ep={ep} etp={etp} sp={sp} train={train} rank={dist.get_rank()}"
    _close(out, want, f"{check} output", atol=1e-5, rtol=1e-4)
    want.backward(grad)
    _close(x.grad, xr.grad, f"{check} grad x", atol=1e-5, rtol=1e-4)
    for i, layer in enumerate(layers):
        _close(layer.router.weight.grad, routers[i].grad, f"{check} layer {i} router grad", atol=1e-5, rtol=1e-4)
    # Expert weight gradients: every rank's tokens reach the expert; sum the dense grads over ranks.
    for i, layer in enumerate(layers):
        g1, g2 = w_leaf[i][0].grad.clone(), w_leaf[i][1].grad.clone()
        if replicas > 1:  # replicas computed the same dense grads: count one copy per DP group
            g1, g2 = g1 / replicas, g2 / replicas
        dist.all_reduce(g1, group=pg.tp_ep)
        dist.all_reduce(g2, group=pg.tp_ep)
        ep_rank, etp_rank = dist.get_rank(pg.ep), dist.get_rank(pg.expt_tp)
        L, part = len(layer.experts.local_experts), FFN // dist.get_world_size(pg.expt_tp)
        for j, expert in enumerate(layer.experts.local_experts):
            e = ep_rank * L + j
            cols = slice(etp_rank * part, (etp_rank + 1) * part)
            what = f"{check} layer {i} expert {e}"
            _close(expert.linear_fc1.weight.grad, g1[e, cols], f"{what} fc1 grad", atol=1e-5, rtol=1e-4)
            _close(expert.linear_fc2.weight.grad, g2[e, :, cols], f"{what} fc2 grad", atol=1e-5, rtol=1e-4)


def _check_plugin_helpers() -> None:
    """swap_token_dispatchers, select_dispatcher, portable state dicts."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    from integration.megatron import MoEBackendTokenDispatcher, select_dispatcher, swap_token_dispatchers

    pg = _init(1, dist.get_world_size())
    config = _config(1, dist.get_world_size(), moe_token_dispatcher_type="allgather")
    spec = _layer_spec()
    stock = MoELayer(config, submodules=spec.keywords["submodules"], pg_collection=pg)
    torch.manual_seed(3)
    ours = spec(config=config, pg_collection=pg)
    assert set(stock.state_dict()) == set(ours.state_dict()), "state dict keys must match the stock layer"
    model = torch.nn.Sequential(stock)
    opts = select_dispatcher("reference")
    assert swap_token_dispatchers(model, opts) == 1
    assert isinstance(stock.token_dispatcher, MoEBackendTokenDispatcher)
    assert config.moe_token_dispatcher_type == "allgather"
    assert select_dispatcher("alltoall", config) is None and config.moe_token_dispatcher_type == "alltoall"
    with pytest.raises(ValueError, match="dispatcher must be one of"):
        select_dispatcher("deepep")
    # The swapped stock layer computes what our layer spec builds, given the same weights.
    stock.load_state_dict(ours.state_dict())
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(11 + dist.get_rank()), requires_grad=True)
    x_ours = x.detach().clone().requires_grad_()
    out, want = stock(x)[0], ours(x_ours)[0]
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(5))
    out.backward(grad)
    want.backward(grad)
    _close(out, want, "swapped layer output", atol=0, rtol=0)
    _close(x.grad, x_ours.grad, "swapped layer input grad", atol=0, rtol=0)
    assert want.abs().sum() > 0 and x_ours.grad.abs().sum() > 0, "a zero layer would make the comparison empty"


def _check_bad_construction_and_routing() -> None:
    """Wrong experts, missing groups, misshapen routing, a second swap with other options:
    each refused with a message naming it, before any communication."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    from integration.megatron import DispatcherOptions, MoEBackendTokenDispatcher, swap_token_dispatchers

    pg = _init(1, 2)
    config = _config(1, 2)
    L, first = E // 2, dist.get_rank() * (E // 2)
    opts = DispatcherOptions(backend="reference")
    with pytest.raises(ValueError, match=rf"local_expert_indices=\[7, 9\]: this EP rank holds experts \[{first}, "):
        MoEBackendTokenDispatcher(L, [7, 9], config, pg, opts)
    with pytest.raises(ValueError, match=r"pg_collection lacks the process groups \['tp_ep', 'ep', 'expt_tp'\]"):
        MoEBackendTokenDispatcher(L, list(range(first, first + L)), config, ProcessGroupCollection(), opts)
    # No pg_collection: Megatron's default groups, as MoEBackendLayer takes them.
    default = MoEBackendTokenDispatcher(L, list(range(first, first + L)), config, None, opts)
    assert default.mapping.world_size == 2 and default.mapping.num_local_experts == L
    x = torch.randn(S * B, H)
    _, routing_map = _random_routing(dist.get_rank(), S * B)
    wide = torch.zeros(S * B, E + 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=rf"routing_map \({S * B}, {E + 2}\) and probs .* \[tokens, num_moe_experts\]"):
        default.dispatch_preprocess(x, wide, wide.float())
    with pytest.raises(ValueError, match=r"routing_map .* must both be"):
        default.dispatch_preprocess(x, routing_map, routing_map.float()[:, :TOPK])
    layer = _layer_spec()(config=config, pg_collection=pg)
    with pytest.raises(ValueError, match="already has our dispatcher with other options"):
        swap_token_dispatchers(torch.nn.Sequential(layer), DispatcherOptions(backend="reference", pad_multiple=8))


def _worker_ep2() -> None:
    _identity_round_trip(tp=1, ep=2, etp=None, sp=None)
    _check_round_trips(tp=1, ep=2, etp=None, sp=None, replicas=1)
    _check_layer(tp=1, ep=2, etp=None, sp=None, train=True)
    _check_plugin_helpers()
    _check_bad_construction_and_routing()


def _worker_tp2() -> None:
    # Sequence parallel, expert-TP 2 x EP 2: distinct tokens, experts sharded over shards.
    _identity_round_trip(tp=2, ep=2, etp=2, sp=True)
    _check_round_trips(tp=2, ep=2, etp=2, sp=True, replicas=1)
    _check_layer(tp=2, ep=2, etp=2, sp=True, train=True)
    # No sequence parallel (inference): TP peers hold the same tokens -> communicator replicas.
    _identity_round_trip(tp=2, ep=2, etp=1, sp=False)
    _check_round_trips(tp=2, ep=2, etp=1, sp=False, replicas=2)
    _check_layer(tp=2, ep=2, etp=1, sp=False, train=False)


def _check_host_counts_move_valid_rows_only() -> None:
    """Static shapes + host counts: the experts, combine and its backward see `total` rows, not R."""
    pg = _init(1, 2)
    disp = _dispatcher(_config(1, 2), pg)
    check = f"host-trim rank {dist.get_rank()}"
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(7 + dist.get_rank())).requires_grad_()
    _, routing_map = _random_routing(dist.get_rank(), S * B)
    probs = (routing_map.float() / TOPK).requires_grad_()
    hidden, p = disp.dispatch_preprocess(x, routing_map, probs)
    hidden, p = disp.token_dispatch(hidden, p)
    static_rows = disp._dispatched.result.handle.src_group.shape[0]
    tokens, tpe, pprobs = disp.dispatch_postprocess(hidden, p)
    total = int(tpe.sum())
    assert total < static_rows == disp._ex.comm.spec.max_recv_tokens, f"{check}: {total} vs {static_rows}"
    assert tokens.shape[0] == pprobs.shape[0] == total, f"{check}: {tokens.shape[0]} rows, {total} valid"
    y = disp.combine_preprocess(tokens * pprobs[:, None])
    assert y.shape[0] == total, f"{check}: combine_preprocess padded {total} rows to {y.shape[0]}"
    with pytest.raises(ValueError, match=rf"expert_y must have at least {total} rows \(the valid rows"):
        disp.token_combine(y[: total - 1])
    seen: list[int] = []  # rows handed to each combine (forward on comm, backward on grad_comm)
    for comm in (disp._ex.comm, disp._ex.grad_comm):
        def spy(expert_y, *args, _orig=comm.combine_send, **kw):
            seen.append(expert_y.shape[0])
            return _orig(expert_y, *args, **kw)
        comm.combine_send = spy
    try:
        out = disp.combine_postprocess(disp.token_combine(y))
        _close(out, x, f"{check} output")
        out.backward(x.detach())
    finally:
        for comm in (disp._ex.comm, disp._ex.grad_comm):
            del comm.combine_send
    _close(x.grad, x.detach(), f"{check} grad x")
    assert seen == [total, total], f"{check}: combines got {seen} rows, want {total} each"


def _worker_ep2_static_shapes() -> None:
    # The GPU backend's static row counts (poison past the valid rows), on the CPU.
    global _BACKEND_OPTIONS
    _BACKEND_OPTIONS = (("static_shapes", True),)
    _identity_round_trip(tp=1, ep=2, etp=None, sp=None)
    _check_round_trips(tp=1, ep=2, etp=None, sp=None, replicas=1)
    _check_host_counts_move_valid_rows_only()


def test_megatron_dispatcher_ep2() -> None:
    spawn(_worker_ep2, 2)


@pytest.mark.parametrize("options, error, message", [
    ({"backend": "alltoall"}, ValueError, r"DispatcherOptions.backend must be one of \('auto', 'reference'"),
    ({"pad_multiple": -4}, ValueError, r"DispatcherOptions.pad_multiple must be None or an integer >= 1, got -4"),
    ({"pad_multiple": 0}, ValueError, r"pad_multiple must be None or an integer >= 1, got 0"),
    ({"max_num_tokens": 0}, ValueError, r"DispatcherOptions.max_num_tokens must be None or an integer >= 1"),
    ({"host_tokens_per_expert": "yes"}, TypeError, r"host_tokens_per_expert must be True or False"),
    ({"backend_options": (("static_shapes", [1]),)}, TypeError, r"'static_shapes': the value must be hashable"),
    ({"backend_options": ("transport",)}, TypeError, r"backend_options must be \(name, value\) pairs"),
])
def test_dispatcher_options_refuse_bad_values(options: dict, error: type, message: str) -> None:
    """A bad option fails at construction (pad_multiple=-4 once dropped tokens silently)."""
    from integration.megatron import DispatcherOptions

    with pytest.raises(error, match=message):
        DispatcherOptions(**options)


def test_layer_spec_refuses_names_and_options_it_would_ignore() -> None:
    from integration.megatron import DispatcherOptions, gpt_layer_spec

    with pytest.raises(ValueError, match=r"dispatcher must be one of .*, got 'foo'"):
        gpt_layer_spec("foo", use_te=False)
    with pytest.raises(ValueError, match="options only apply to .*'alltoall' would ignore them"):
        gpt_layer_spec("alltoall", use_te=False, options=DispatcherOptions())
    with pytest.raises(ValueError, match="dispatcher 'nvshmem' with options.backend='reference': pick one"):
        gpt_layer_spec("nvshmem", use_te=False, options=DispatcherOptions(backend="reference"))


def _worker_checkpointed() -> None:
    """Megatron's six steps under torch's non-reentrant activation checkpointing, three steps in a
    row: the recomputed rounds close (the next step's dispatch is accepted) and the outputs and
    gradients are those of the same steps without checkpointing, bit for bit."""
    from torch.utils.checkpoint import checkpoint

    pg = _init(1, 2)
    disp = _dispatcher(_config(1, 2), pg)
    seed = dist.get_rank()
    _, routing_map = _random_routing(seed, S * B)

    def step(x: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        return _round_trip(disp, x, routing_map, probs, "checkpointed")[0]

    got = []
    for checkpointed in (False, True, True):
        x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(100 + seed)).requires_grad_()
        probs = (routing_map.float() / TOPK).requires_grad_()
        out = checkpoint(step, x, probs, use_reentrant=False) if checkpointed else step(x, probs)
        out.backward(torch.ones_like(out))
        got.append((out.detach(), x.grad, probs.grad))
    for later in got[1:]:
        assert all(torch.equal(a, b) for a, b in zip(got[0], later)), "checkpointed steps differ"


def test_megatron_dispatcher_under_activation_checkpointing() -> None:
    spawn(_worker_checkpointed, 2)


def test_megatron_dispatcher_static_shapes() -> None:
    spawn(_worker_ep2_static_shapes, 2)


def test_megatron_dispatcher_expert_tp_and_replicas() -> None:
    spawn(_worker_tp2, 4)


@pytest.mark.parametrize("env, message", [
    ({"MOE_BACKEND_DISPATCHER": "refrence"}, "MOE_BACKEND_DISPATCHER must be one of"),
    ({"MOE_BACKEND_GROUPED_GEMM": "true"}, "MOE_BACKEND_GROUPED_GEMM must be 0 or 1, got 'true'"),
])
def test_spec_module_names_a_bad_environment_variable(env: dict[str, str], message: str) -> None:
    """`--spec integration.megatron.spec gpt_layer_spec` reads these at import: a typo must not
    silently pick another dispatcher or turn a switch off."""
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", "import integration.megatron.spec"], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=120)
    assert run.returncode != 0 and message in run.stderr, run.stderr[-2000:]


def test_training_waits_longer_for_a_late_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the nvshmem backend runs, the dispatcher's communicators wait TRAINING_WAIT_S for a late
    peer (a rank's data loading or checkpoint must not fail the run), unless the options set it;
    the reference backend takes no such option."""
    from integration.megatron import DispatcherOptions
    from integration.megatron import dispatcher as mod
    from moe_backend.backends import DEFAULT_WAIT_S, TRAINING_WAIT_S

    assert TRAINING_WAIT_S > DEFAULT_WAIT_S
    cpu = torch.device("cpu")
    assert mod.communicator_options(DispatcherOptions(backend="auto"), cpu) == {"check_inputs": False}
    monkeypatch.setattr(mod, "resolve_backend", lambda name, device: "nvshmem")
    assert mod.communicator_options(DispatcherOptions(), cpu) == {"check_inputs": False, "timeout_s": TRAINING_WAIT_S}
    chosen = DispatcherOptions(backend="nvshmem", backend_options=(("timeout_s", 2.5), ("transport", "put")))
    assert mod.communicator_options(chosen, cpu) == {"check_inputs": False, "timeout_s": 2.5, "transport": "put"}
