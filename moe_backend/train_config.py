"""Typed training configs (`configs/train/*.yaml`), loaded with `config.load`.

A file fixes the model, the parallel layout, the dispatcher and the run; `validate()`
rejects combinations Megatron would refuse (or silently mis-shard) with a message naming
the key, e.g. `parallel.ep: num_experts=6 is not divisible by ep=4`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .backends import TRAINING_WAIT_S
from .backends.nvshmem_runtime import TRANSPORTS
from .config import ConfigError, configs_dir, load, resolve_config

# `auto`: nvshmem where its kernels can run, else reference (the embedded default on CPU).
DISPATCHERS = ("auto", "nvshmem", "reference", "alltoall", "allgather", "flex")
PRECISIONS = ("fp32", "bf16")
POSITION_EMBEDDINGS = ("learned_absolute", "rope")
NORMALIZATIONS = ("LayerNorm", "RMSNorm")
SCORE_FUNCTIONS = ("softmax", "sigmoid")


@dataclasses.dataclass
class ModelConfig:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_experts: int  # every layer is an MoE layer
    topk: int
    moe_ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    num_query_groups: int | None = None  # GQA; None = one group per head
    shared_expert_hidden_size: int | None = None  # DeepSeek-style shared expert
    position_embedding: str = "learned_absolute"
    normalization: str = "LayerNorm"
    swiglu: bool = False
    router_score_function: str = "softmax"
    aux_loss_coeff: float = 0.01
    init_method_std: float = 0.02


@dataclasses.dataclass
class ParallelConfig:
    world_size: int = 1  # processes started locally; must match torchrun's WORLD_SIZE
    tp: int = 1  # attention tensor parallel (sequence parallel is switched on with it)
    ep: int = 1  # expert parallel
    expert_tp: int = 1  # tensor parallel inside each expert
    # dp (and expert dp) follow: dp = world / tp, expert dp = world / (ep * expert_tp)


@dataclasses.dataclass
class DispatcherOptionsConfig:
    """Options of our dispatchers (`nvshmem`, `reference`); Megatron's own ignore them."""

    check_inputs: bool = False  # value checks of the router's topk_ids: host syncs, for debugging
    combine_in_float32: bool = False  # combine partials in float32
    transport: str = "auto"  # nvshmem: auto | put | nvlink
    timeout_s: float = TRAINING_WAIT_S  # nvshmem: how long a receive waits for a late peer
    num_sms: int | None = None  # nvshmem: SMs the kernels size their grids for (None: all)
    send_stream: bool = False  # nvshmem: dispatch send kernel on a stream of its own (split use)


@dataclasses.dataclass
class RunConfig:
    steps: int = 20
    micro_batch_size: int = 4
    lr: float = 1e-3
    min_lr: float = 0.0
    warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    precision: str = "fp32"  # bf16: bf16 weights and activations, fp32 master weights and Adam
    seed: int = 1234
    timing_warmup: int = 2  # first steps left out of the summary's medians


@dataclasses.dataclass
class OutputConfig:
    dir: str = "out/train"
    progress: bool = True  # one line per step from rank 0


@dataclasses.dataclass
class TrainConfig:
    name: str
    model: ModelConfig
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    dispatcher: str = "auto"
    dispatcher_options: DispatcherOptionsConfig = dataclasses.field(default_factory=DispatcherOptionsConfig)
    train: RunConfig = dataclasses.field(default_factory=RunConfig)
    output: OutputConfig = dataclasses.field(default_factory=OutputConfig)

    def validate(self) -> None:
        for err in _problems(self):
            raise ConfigError(err)

    @property
    def dp(self) -> int:
        return self.parallel.world_size // self.parallel.tp

    @property
    def expert_dp(self) -> int:
        return self.parallel.world_size // (self.parallel.ep * self.parallel.expert_tp)

    def tokens_per_step(self) -> int:
        """Tokens trained on per step, over all data-parallel replicas."""
        return self.dp * self.train.micro_batch_size * self.model.seq_length


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str | None:
    return None if value in allowed else f"{key}: {value!r} is not one of {list(allowed)}"


def _problems(c: TrainConfig) -> list[str]:
    """Every rule, in the order a reader would check them; the first failure is reported."""
    m, p, r = c.model, c.parallel, c.train
    out: list[str | None] = []
    positive = {
        "model.num_layers": m.num_layers, "model.hidden_size": m.hidden_size,
        "model.num_attention_heads": m.num_attention_heads, "model.num_experts": m.num_experts,
        "model.topk": m.topk, "model.moe_ffn_hidden_size": m.moe_ffn_hidden_size,
        "model.vocab_size": m.vocab_size, "model.seq_length": m.seq_length,
        "parallel.world_size": p.world_size, "parallel.tp": p.tp, "parallel.ep": p.ep,
        "parallel.expert_tp": p.expert_tp, "train.steps": r.steps,
        "train.micro_batch_size": r.micro_batch_size,
    }
    for key, value in (("model.num_query_groups", m.num_query_groups),
                       ("model.shared_expert_hidden_size", m.shared_expert_hidden_size)):
        if value is not None:  # optional, but when given megatron-core divides by it
            positive[key] = value
    out += [f"{k}: must be >= 1, got {v}" for k, v in positive.items() if v < 1]
    if out:
        return [e for e in out if e]
    out.append(_choice("dispatcher", c.dispatcher, DISPATCHERS))
    d = c.dispatcher_options
    out.append(_choice("dispatcher_options.transport", d.transport, TRANSPORTS))
    if d.timeout_s <= 0:
        out.append(f"dispatcher_options.timeout_s: must be > 0, got {d.timeout_s}")
    if d.num_sms is not None and d.num_sms < 1:
        out.append(f"dispatcher_options.num_sms: must be >= 1 (or absent: every SM), got {d.num_sms}")
    out.append(_choice("train.precision", r.precision, PRECISIONS))
    out.append(_choice("model.position_embedding", m.position_embedding, POSITION_EMBEDDINGS))
    out.append(_choice("model.normalization", m.normalization, NORMALIZATIONS))
    out.append(_choice("model.router_score_function", m.router_score_function, SCORE_FUNCTIONS))
    if m.topk > m.num_experts:
        out.append(f"model.topk: {m.topk} is more than model.num_experts={m.num_experts}")
    if m.hidden_size % m.num_attention_heads:
        out.append(f"model.hidden_size: {m.hidden_size} is not divisible by "
                   f"num_attention_heads={m.num_attention_heads}")
    groups = m.num_query_groups or m.num_attention_heads
    if m.num_attention_heads % groups:
        out.append(f"model.num_query_groups: num_attention_heads={m.num_attention_heads} is not divisible by {groups}")
    # The expert grid (ep x expert_tp) and the attention grid (tp) each tile the world.
    if p.world_size % p.tp:
        out.append(f"parallel.tp: world_size={p.world_size} is not divisible by tp={p.tp}")
    if p.world_size % (p.ep * p.expert_tp):
        out.append(f"parallel.ep: world_size={p.world_size} is not divisible by ep*expert_tp={p.ep * p.expert_tp}")
    if m.num_experts % p.ep:
        out.append(f"parallel.ep: model.num_experts={m.num_experts} is not divisible by ep={p.ep}"
                   " (every EP rank holds the same number of experts)")
    if m.num_attention_heads % p.tp:
        out.append(f"parallel.tp: model.num_attention_heads={m.num_attention_heads} is not divisible by tp={p.tp}")
    if groups % p.tp:
        out.append(f"parallel.tp: model.num_query_groups={groups} is not divisible by tp={p.tp}")
    if m.vocab_size % p.tp:
        out.append(f"parallel.tp: model.vocab_size={m.vocab_size} is not divisible by tp={p.tp}")
    if m.seq_length % p.tp:
        out.append(f"parallel.tp: model.seq_length={m.seq_length} is not divisible by tp={p.tp}"
                   " (MoE training with tp > 1 needs sequence parallelism, which splits the sequence)")
    if m.moe_ffn_hidden_size % p.expert_tp:
        out.append(f"parallel.expert_tp: model.moe_ffn_hidden_size={m.moe_ffn_hidden_size}"
                   f" is not divisible by expert_tp={p.expert_tp}")
    if m.shared_expert_hidden_size and m.shared_expert_hidden_size % p.tp:
        out.append(f"parallel.tp: model.shared_expert_hidden_size={m.shared_expert_hidden_size}"
                   f" is not divisible by tp={p.tp}")
    if c.dispatcher == "allgather" and p.ep > 1 and p.expert_tp > 1 and p.tp != p.expert_tp:
        out.append("dispatcher: allgather needs expert_tp == tp when both ep and expert_tp are > 1")
    if r.lr <= 0 or r.min_lr < 0 or r.min_lr > r.lr:
        out.append(f"train.lr: need 0 <= min_lr <= lr and lr > 0, got lr={r.lr}, min_lr={r.min_lr}")
    if r.warmup_steps < 0 or (r.warmup_steps > 0 and r.warmup_steps >= r.steps):
        out.append(f"train.warmup_steps: {r.warmup_steps} must be in [0, steps={r.steps})")
    if r.grad_clip < 0 or r.weight_decay < 0:
        out.append("train.grad_clip / train.weight_decay: must be >= 0")
    if not 0 <= r.timing_warmup < r.steps:
        out.append(f"train.timing_warmup: {r.timing_warmup} must be in [0, steps={r.steps})")
    if m.aux_loss_coeff < 0:
        out.append(f"model.aux_loss_coeff: must be >= 0, got {m.aux_loss_coeff}")
    if m.init_method_std <= 0:
        out.append(f"model.init_method_std: must be > 0, got {m.init_method_std}")
    if not 0 <= r.seed < 2**32:  # torch seeds are 64-bit; ranks and layers derive seed * 1000 + k
        out.append(f"train.seed: must be in [0, 2**32), got {r.seed}")
    return [e for e in out if e]


def check_world(cfg: TrainConfig, world_size: int, where: str = "launch") -> None:
    """A launch with another world size (torchrun, Slurm) re-checks the layout for it."""
    if world_size != cfg.parallel.world_size:
        cfg.parallel.world_size = world_size
        try:
            cfg.validate()
        except ConfigError as err:
            raise ConfigError(f"{cfg.name} at world size {world_size} ({where}): {err}") from None


def check_device(cfg: TrainConfig, on_gpu: bool) -> None:
    """Rules that depend on where it runs (Megatron pieces that only exist on CUDA)."""
    if on_gpu:
        return
    if cfg.dispatcher not in ("reference", "auto"):  # the others' Megatron pieces allocate on CUDA
        raise ConfigError(f"dispatcher: {cfg.dispatcher!r} needs CUDA GPUs; on CPU use 'reference' (or 'auto')")
    if cfg.model.position_embedding == "rope":
        raise ConfigError("model.position_embedding: 'rope' needs CUDA in megatron-core; use 'learned_absolute' on CPU")
    if cfg.parallel.tp > 1 or cfg.parallel.expert_tp > 1:
        raise ConfigError("parallel.tp / parallel.expert_tp: tensor parallelism needs CUDA GPUs in megatron-core")


def load_train(path: str | Path) -> TrainConfig:
    return load(path, TrainConfig)


def train_configs_dir() -> Path:
    return configs_dir("train")


def resolve_train_config(name: str) -> Path:
    return resolve_config(name, train_configs_dir())
