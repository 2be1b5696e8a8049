"""An inference decode loop: one step (dispatch, experts, combine) on fixed buffers, the live
batch size in a device tensor, so nothing in the step waits for the host.

    python examples/decode_step.py                      # 2 local processes (gloo on CPU, NCCL on GPUs)
    torchrun --nproc-per-node 2 examples/decode_step.py
    python examples/decode_step.py --padded             # the padded layout: comm.dispatch_padded

Where the nvshmem kernels run (H100 / H200), the step is captured once in a CUDA graph and each
decode step is a copy of the new batch into the buffers and a replay; elsewhere the same step
runs eagerly. Every step's output is checked against the same computation done densely: the
live rows, and zeros past them.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from moe_backend import CommSpec, Communicator
from moe_backend.launch import run_everywhere

NUM_EXPERTS, TOPK, HIDDEN, MAX_TOKENS = 8, 2, 64, 16
BATCHES = (16, 3, 1, 9, 0, 12)  # live tokens per decode step, at most MAX_TOKENS


def expert_scale(expert: torch.Tensor) -> torch.Tensor:
    """Each expert's "weights": a scale of its own (a real layer runs an MLP per expert)."""
    return 1.0 + expert.float() / NUM_EXPERTS


class DecodeStep:
    """Fixed input buffers and the step that reads them; `load` puts a new batch in place."""

    def __init__(self, comm: Communicator, device: torch.device, padded: bool = False) -> None:
        self.comm, spec = comm, comm.spec
        self.padded = padded
        self.x = torch.zeros(MAX_TOKENS, HIDDEN, device=device)
        self.ids = torch.full((MAX_TOKENS, TOPK), -1, dtype=torch.int32, device=device)
        self.weights = torch.zeros(MAX_TOKENS, TOPK, device=device)
        self.n = torch.zeros(1, dtype=torch.int32, device=device)  # live rows; the rest are ignored
        self.first_expert = comm.rank * spec.num_local_experts

    def load(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> None:
        rows = x.shape[0]
        self.x[:rows].copy_(x)
        self.ids[:rows].copy_(ids)
        self.weights[:rows].copy_(weights)
        self.n.fill_(rows)

    def __call__(self) -> torch.Tensor:
        if self.padded:
            # Each local expert's rows as one [groups * MAX_TOKENS, HIDDEN] batch (the rows past
            # its counts hold garbage, which combine_padded never reads).
            padded = self.comm.dispatch_padded(self.x, self.ids, self.weights, num_tokens=self.n)
            experts = self.first_expert + torch.arange(padded.tokens.shape[0], device=self.x.device)
            y = padded.tokens * expert_scale(experts)[:, None, None]
            return self.comm.combine_padded(y, padded.handle, weights=padded.weights)
        result = self.comm.dispatch(self.x, self.ids, self.weights, num_tokens=self.n)
        # Each row's local expert from the device offsets (no host sync: graph-safe); rows past
        # the valid total belong to no expert and are never read by combine.
        local = result.local_experts()
        y = result.tokens * expert_scale(self.first_expert + local)[:, None]
        return self.comm.combine(y, result.handle, weights=result.weights)


def main(padded: bool = False) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    spec = CommSpec(num_experts=NUM_EXPERTS, topk=TOPK, hidden=HIDDEN, max_num_tokens=MAX_TOKENS, world_size=world,
                    in_dtype=torch.float32, out_dtype=torch.float32)
    # No per-call value checks: they would read the device batch size on the host (a sync).
    comm = Communicator(spec, backend="auto", check_inputs=False)
    step = DecodeStep(comm, device, padded)
    graphed = comm.backend_name == "nvshmem"  # static shapes, the round on the device: capturable

    gen = torch.Generator().manual_seed(100 + rank)

    def new_batch(tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.randn(tokens, HIDDEN, generator=gen)
        weights, ids = torch.rand(tokens, NUM_EXPERTS, generator=gen).softmax(dim=1).topk(TOPK, dim=1)
        return x.to(device), ids.int().to(device), weights.to(device)

    step.load(*new_batch(MAX_TOKENS))
    out = step()  # one eager round first (and the arena's setup)
    if graphed:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()

    for tokens in BATCHES:
        x, ids, weights = new_batch(tokens)
        step.load(x, ids, weights)
        if graphed:
            graph.replay()
        else:
            out = step()
        dense = (x[:, None, :] * (weights * expert_scale(ids))[:, :, None]).sum(dim=1)
        torch.testing.assert_close(out[:tokens], dense)
        assert not out[tokens:].any(), "rows past the live batch must be zero"
    if graphed:
        graph.reset()
    comm.close()
    how = ("one CUDA graph replayed" if graphed else "eagerly") + (", padded layout" if padded else "")
    print(f"rank {rank}: {comm.backend_name} backend, decode steps of {', '.join(map(str, BATCHES))} tokens "
          f"({how}): every step matches the dense computation", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--padded", action="store_true",
                        help="dispatch_padded / combine_padded: each local expert's rows as one padded batch")
    args = parser.parse_args()
    run_everywhere(main, int(os.environ.get("WORLD_SIZE", "2")), args.padded)
