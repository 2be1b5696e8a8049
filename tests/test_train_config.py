"""TrainConfig: shipped configs load; every bad combination is rejected naming the key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from moe_backend.config import ConfigError
from moe_backend.train_config import (
    TrainConfig,
    check_device,
    check_world,
    load_train,
    resolve_train_config,
    train_configs_dir,
)

BASE = yaml.safe_load((train_configs_dir() / "tiny.yaml").read_text())


def test_shipped_configs_load() -> None:
    names = sorted(p.stem for p in train_configs_dir().glob("*.yaml"))
    assert {"tiny", "mixtral_2gpu", "deepseek_2gpu"} <= set(names)
    for name in names:
        cfg = load_train(resolve_train_config(name))
        assert isinstance(cfg, TrainConfig) and cfg.parallel.world_size >= 1
    assert load_train(resolve_train_config("deepseek_2gpu")).model.shared_expert_hidden_size


def _load(tmp_path: Path, edit: dict) -> TrainConfig:
    data = copy.deepcopy(BASE)
    for dotted, value in edit.items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_train(path)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"model.num_experts": 6, "parallel.ep": 4, "parallel.world_size": 4},
         "parallel.ep: model.num_experts=6 is not divisible by ep=4"),
        ({"parallel.ep": 4}, "parallel.ep: world_size=2 is not divisible by ep*expert_tp=4"),
        ({"parallel.tp": 2, "model.num_attention_heads": 3, "model.hidden_size": 63},
         "parallel.tp: model.num_attention_heads=3 is not divisible by tp=2"),
        ({"parallel.tp": 3}, "parallel.tp: world_size=2 is not divisible by tp=3"),
        ({"parallel.expert_tp": 2, "parallel.ep": 1, "model.moe_ffn_hidden_size": 127},
         "parallel.expert_tp: model.moe_ffn_hidden_size=127 is not divisible by expert_tp=2"),
        ({"model.topk": 5}, "model.topk: 5 is more than model.num_experts=4"),
        ({"dispatcher": "deepep"}, "dispatcher: 'deepep' is not one of"),
        ({"train.precision": "fp16"}, "train.precision: 'fp16' is not one of"),
        ({"model.hidden_size": 66}, "model.hidden_size: 66 is not divisible by num_attention_heads=4"),
        ({"train.steps": 0}, "train.steps: must be >= 1"),
        ({"train.timing_warmup": 40}, "train.timing_warmup: 40 must be in [0, steps=40)"),
        ({"model.num_expert": 4}, "model.num_expert: unknown key"),
        ({"parallel.ep": "two"}, "parallel.ep: expected int"),
        ({"dispatcher_options.transport": "ib"}, "dispatcher_options.transport: 'ib' is not one of"),
        ({"dispatcher_options.timeout_s": 0}, "dispatcher_options.timeout_s: must be > 0"),
        ({"dispatcher_options.num_sms": 0}, "dispatcher_options.num_sms: must be >= 1"),
        ({"dispatcher_options.send_stream": "yes"}, "dispatcher_options.send_stream: expected bool"),
        ({"dispatcher_options.check_input": True}, "dispatcher_options.check_input: unknown key"),
        # Values megatron-core or torch would trip over deep inside the ranks, or train on silently.
        ({"train.lr": float("inf")}, "train.lr: expected a finite number, got inf"),
        ({"train.grad_clip": float("nan")}, "train.grad_clip: expected a finite number, got nan"),
        ({"model.aux_loss_coeff": float("nan")}, "model.aux_loss_coeff: expected a finite number"),
        ({"dispatcher_options.timeout_s": float("inf")}, "dispatcher_options.timeout_s: expected a finite number"),
        ({"model.num_query_groups": 0}, "model.num_query_groups: must be >= 1, got 0"),
        ({"model.shared_expert_hidden_size": -64}, "model.shared_expert_hidden_size: must be >= 1, got -64"),
        ({"model.init_method_std": -1.0}, "model.init_method_std: must be > 0, got -1.0"),
        ({"train.seed": 10**20}, "train.seed: must be in [0, 2**32)"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, edit: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, edit)
    assert message in str(err.value)
    assert "bad.yaml" in str(err.value)  # the file is named too


def test_world_size_from_launch_is_rechecked() -> None:
    cfg = load_train(resolve_train_config("tiny"))
    check_world(cfg, 4)  # 4 experts over ep=2, dp=4: fine
    assert cfg.parallel.world_size == 4 and cfg.dp == 4 and cfg.expert_dp == 2
    with pytest.raises(ConfigError, match=r"at world size 3 .*parallel.ep: world_size=3 is not divisible"):
        check_world(load_train(resolve_train_config("tiny")), 3)


def test_cpu_rejects_gpu_only_choices() -> None:
    cfg = load_train(resolve_train_config("mixtral_2gpu"))
    with pytest.raises(ConfigError, match="model.position_embedding: 'rope' needs CUDA"):
        check_device(cfg, on_gpu=False)
    cfg.model.position_embedding = "learned_absolute"
    for name in ("alltoall", "allgather", "flex", "nvshmem"):
        cfg.dispatcher = name
        with pytest.raises(ConfigError, match=f"dispatcher: '{name}' needs CUDA"):
            check_device(cfg, on_gpu=False)
        check_device(cfg, on_gpu=True)
    for name in ("reference", "auto"):
        cfg.dispatcher = name
        check_device(cfg, on_gpu=False)


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"presets in configs/train: \[.*'tiny'"):
        resolve_train_config("no_such_config")


def test_dispatcher_options_reach_our_dispatcher(tmp_path: Path) -> None:
    """YAML `dispatcher_options` -> the `DispatcherOptions` of the MoE layers in the spec."""
    from moe_backend.training import dispatchers
    from moe_backend.training.model import layer_spec

    cfg = _load(tmp_path, {"dispatcher_options.check_inputs": True, "dispatcher_options.transport": "put",
                           "dispatcher_options.num_sms": 24, "dispatcher_options.send_stream": True})
    spec = dispatchers.with_dispatcher(layer_spec(cfg), "nvshmem", cfg.dispatcher_options)
    opts = spec.submodules.mlp.keywords["options"]
    assert opts.backend == "nvshmem" and opts.check_inputs and not opts.combine_in_float32
    assert dict(opts.backend_options) == {"transport": "put", "timeout_s": 300.0, "num_sms": 24, "send_stream": True}
    ref = dispatchers.with_dispatcher(layer_spec(cfg), "reference", cfg.dispatcher_options)
    assert ref.submodules.mlp.keywords["options"].backend_options == ()  # nvshmem-only options stay out
    assert dispatchers.with_dispatcher("unchanged", "alltoall", cfg.dispatcher_options) == "unchanged"


def test_ep_override_from_the_command_line() -> None:
    """`--world-size 4 --ep 4` (how the GPU scripts ask for EP4 / EP8) reaches the config."""
    import argparse

    from moe_backend.training.cli import load_with_overrides

    args = argparse.Namespace(config="tiny", steps=None, world_size=4, ep=4, dispatcher=None)
    cfg = load_with_overrides(args)
    assert cfg.parallel.world_size == 4 and cfg.parallel.ep == 4 and cfg.expert_dp == 1
    args.ep = 3
    with pytest.raises(ConfigError, match="parallel.ep"):
        load_with_overrides(args)
