"""Dispatch tokens to their experts, run the experts, combine the weighted results.

    python examples/dispatch_combine.py                 # 2 local processes (gloo on CPU, NCCL on GPUs)
    torchrun --nproc-per-node 2 examples/dispatch_combine.py

Every rank routes its tokens to top-2 of 8 experts (4 per rank), each expert scales its rows
by a factor of its own, and the combined output is checked against the same computation
done densely on the rank itself. The second half does it again in split phases, with a shared
expert computed between send and receive.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from moe_backend import CommSpec, Communicator
from moe_backend.launch import run_everywhere

NUM_EXPERTS, TOPK, HIDDEN, TOKENS = 8, 2, 64, 16


def expert_scale(expert: torch.Tensor) -> torch.Tensor:
    """Each expert's "weights": a scale of its own (a real layer runs an MLP per expert)."""
    return 1.0 + expert.float() / NUM_EXPERTS


def run_experts(result, rank: int, local_experts: int) -> torch.Tensor:
    """Rows come grouped by local expert: expert e's rows are expert_offsets[e]:expert_offsets[e+1]."""
    counts = result.tokens_per_expert.tolist()  # one host sync; grouped GEMMs can take the device tensor
    local = torch.repeat_interleave(torch.arange(local_experts, device=result.tokens.device),
                                    torch.tensor(counts, device=result.tokens.device))
    total = sum(counts)
    y = torch.zeros_like(result.tokens)
    y[:total] = result.tokens[:total] * expert_scale(rank * local_experts + local)[:, None].to(y.dtype)
    return y


def main() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    spec = CommSpec(num_experts=NUM_EXPERTS, topk=TOPK, hidden=HIDDEN, max_num_tokens=TOKENS, world_size=world,
                    in_dtype=torch.float32, out_dtype=torch.float32)
    comm = Communicator(spec, backend="auto")  # nvshmem kernels where they run, else the reference

    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(TOKENS, HIDDEN, generator=gen).to(device)
    scores = torch.rand(TOKENS, NUM_EXPERTS, generator=gen).softmax(dim=1)
    weights, ids = scores.topk(TOPK, dim=1)
    ids, weights = ids.to(device), weights.to(device)

    result = comm.dispatch(x, ids, weights)
    y = run_experts(result, rank, spec.num_local_experts)
    out = comm.combine(y, result.handle, weights=result.weights)
    dense = (x[:, None, :] * (weights * expert_scale(ids))[:, :, None]).sum(dim=1)
    torch.testing.assert_close(out, dense)

    # Split phases: work that does not touch the communicator runs while the tokens travel,
    # here a "shared expert" every token goes through.
    receiver = comm.dispatch_send(x, ids, weights)
    shared = 0.5 * x
    result = receiver.recv()
    out = comm.combine_send(run_experts(result, rank, spec.num_local_experts), result.handle,
                            weights=result.weights).recv() + shared
    torch.testing.assert_close(out, dense + shared)
    comm.close()
    print(f"rank {rank}: {comm.backend_name} backend, {TOKENS} tokens to top-{TOPK} of {NUM_EXPERTS} experts: "
          "dispatch + experts + combine match the dense computation", flush=True)


if __name__ == "__main__":
    run_everywhere(main, int(os.environ.get("WORLD_SIZE", "2")))
