"""One differentiable MoE step: gradients flow back through combine and dispatch.

    python examples/training_step.py                    # 2 local processes (gloo on CPU, NCCL on GPUs)
    torchrun --nproc-per-node 2 examples/training_step.py

Each rank owns 2 of 4 experts (a weight matrix each). The forward dispatches, runs the local
experts, combines weighted by the router's probabilities; `backward()` runs the mirrored
combine/dispatch pair (docs/MEGATRON_INTEGRATION.md, "Autograd"). The gradients of the input,
the router logits and the expert weights are checked against the same model computed densely
on each rank (an expert's weight gradient summed over the ranks' tokens).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from moe_backend import CommSpec
from moe_backend.autograd import DifferentiableCommunicator
from moe_backend.launch import run_everywhere

NUM_EXPERTS, TOPK, HIDDEN, TOKENS = 4, 2, 16, 8


def main() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    spec = CommSpec(num_experts=NUM_EXPERTS, topk=TOPK, hidden=HIDDEN, max_num_tokens=TOKENS, world_size=world,
                    in_dtype=torch.float32, out_dtype=torch.float32)
    ex = DifferentiableCommunicator.create(spec, backend="auto")  # forward and backward communicators
    L = spec.num_local_experts

    # Every rank builds all experts from one seed and keeps its own as parameters.
    all_w = torch.randn(NUM_EXPERTS, HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(0)) / HIDDEN**0.5
    mine = all_w[rank * L:(rank + 1) * L].clone().to(device).requires_grad_()
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(TOKENS, HIDDEN, generator=gen).to(device).requires_grad_()
    logits = torch.randn(TOKENS, NUM_EXPERTS, generator=gen).to(device).requires_grad_()
    probs, ids = logits.softmax(dim=1).topk(TOPK, dim=1)

    d = ex.dispatch(x, ids, probs, valid_only=True)  # valid_only: only the rows routed here
    counts = d.host_tokens_per_expert.tolist()
    y = torch.cat([rows @ mine[e] for e, rows in enumerate(d.tokens.split(counts))])
    out = ex.combine(y, d, weights=d.weights)
    loss = (out * torch.arange(1.0, HIDDEN + 1, device=device)).sum()
    loss.backward()

    # The same model, dense, on this rank's tokens (every rank holds every expert's weights).
    ref_x = x.detach().clone().requires_grad_()
    ref_logits = logits.detach().clone().requires_grad_()
    ref_w = all_w.to(device).requires_grad_()
    ref_probs, _ = ref_logits.softmax(dim=1).topk(TOPK, dim=1)
    ref_out = torch.einsum("tk,tkh->th", ref_probs, torch.einsum("th,tkhj->tkj", ref_x, ref_w[ids]))
    (ref_out * torch.arange(1.0, HIDDEN + 1, device=device)).sum().backward()
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(x.grad, ref_x.grad)
    torch.testing.assert_close(logits.grad, ref_logits.grad)
    # An expert's gradient sums over every rank's tokens: reduce the dense per-rank parts.
    expert_grad = ref_w.grad.clone()
    dist.all_reduce(expert_grad)
    torch.testing.assert_close(mine.grad, expert_grad[rank * L:(rank + 1) * L])
    print(f"rank {rank}: {ex.comm.backend_name} backend: output and the gradients of x, the router logits "
          "and the expert weights match the dense model", flush=True)


if __name__ == "__main__":
    run_everywhere(main, int(os.environ.get("WORLD_SIZE", "2")))
