"""Megatron's process groups -> one communicator group, its replicas and its expert ids.

The communicator runs on Megatron's TP x EP group (`pg_collection.tp_ep`, expert-TP x EP),
the group across which Megatron's alltoall dispatcher moves tokens.

- Expert tensor parallelism (`expt_tp` size `etp > 1`): every expert is sharded over the
  `etp` ranks of an expert-TP group; each shard must see all of the expert's tokens and
  the partial outputs are summed. Each global expert `e` becomes `etp` *virtual* experts,
  one per shard, owned by the comm rank holding that shard; a token is dispatched to every
  shard and combine's sum is Megatron's reduce-scatter.
- Distinct tokens vs replicas: with sequence parallelism (required for training with
  TP > 1) or TP == 1 every rank of the group holds different tokens: `tp_size = 1`.
  Without sequence parallelism (inference) the ranks of one attention-TP group hold the
  *same* tokens; when those replicas are consecutive, aligned ranks of the comm group they
  become the communicator's `tp_size` (each replica sends a share, all receive the full
  output). Otherwise they are treated as distinct tokens, which is correct but sends each
  token once per replica (as Megatron's alltoall does).
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GroupMapping:
    group: dist.ProcessGroup | None
    world_size: int
    rank: int
    replicas: int  # the communicator's tp_size
    etp: int
    num_experts: int  # Megatron's global experts
    num_local_experts: int
    virtual: tuple[tuple[int, ...], ...]  # [E][etp] -> communicator expert id

    @property
    def num_virtual_experts(self) -> int:
        return self.num_experts * self.etp

    def virtual_table(self, device: torch.device) -> torch.Tensor:
        return torch.tensor(self.virtual, dtype=torch.int64, device=device)


def _size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _rank(group: dist.ProcessGroup | None) -> int:
    return 0 if group is None else dist.get_rank(group)


def token_key(pg_collection, sequence_parallel: bool) -> tuple[int, ...]:
    """Equal on ranks that hold the same tokens: attention-TP peers without sequence parallel."""
    tp = getattr(pg_collection, "tp", None)
    if tp is not None and _size(tp) > 1 and not sequence_parallel:
        return tuple(dist.get_process_group_ranks(tp))
    return (dist.get_rank(),)


def replica_blocks(keys: list[tuple[int, ...]]) -> int:
    """`tp_size` when equal keys form consecutive aligned blocks of one size, else 1."""
    size = sum(1 for k in keys if k == keys[0])
    if size <= 1 or len(keys) % size:
        return 1
    blocks = [keys[i : i + size] for i in range(0, len(keys), size)]
    if all(len(set(b)) == 1 for b in blocks) and len({b[0] for b in blocks}) == len(blocks):
        return size
    return 1


def build_mapping(pg_collection, num_experts: int, sequence_parallel: bool) -> GroupMapping:
    """Collective over the TP x EP group (one small all_gather_object, at construction)."""
    missing = [n for n in ("tp_ep", "ep", "expt_tp") if getattr(pg_collection, n, None) is None]
    if missing:  # an unset group would read as one rank: a layer that silently never communicates
        raise ValueError(f"pg_collection lacks the process groups {missing} (Megatron's get_default_pg_collection() "
                         "has them)")
    group = pg_collection.tp_ep
    ep, etp = _size(pg_collection.ep), _size(pg_collection.expt_tp)
    world = _size(group)
    if world != ep * etp:
        raise ValueError(f"tp_ep group has {world} ranks, expected ep*expt_tp = {ep}*{etp}")
    if num_experts % ep:
        raise ValueError(f"num_moe_experts={num_experts} must be divisible by the EP size {ep}")
    mine = (_rank(pg_collection.ep), _rank(pg_collection.expt_tp), token_key(pg_collection, sequence_parallel))
    every: list = [None] * world
    if world > 1:
        dist.all_gather_object(every, mine, group=group)
    else:
        every = [mine]
    where = {(e, s): c for c, (e, s, _) in enumerate(every)}
    if len(where) != world:
        raise ValueError(f"(ep rank, expert-TP rank) pairs are not unique over the tp_ep group: {every}")
    L = num_experts // ep
    virtual = tuple(tuple(where[(e // L, s)] * L + e % L for s in range(etp)) for e in range(num_experts))
    keys = [k for _, _, k in every]
    replicas = replica_blocks(keys)
    if replicas == 1 and len(set(keys)) < world:
        log.warning("ranks holding the same tokens are not consecutive in the tp_ep group: sending each copy")
    return GroupMapping(group, world, _rank(group), replicas, etp, num_experts, L, virtual)
