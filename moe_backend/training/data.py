"""Mock token data with something to learn.

Each sequence is an arithmetic progression modulo the vocabulary (`start + stride * i`),
with the start and stride drawn per sequence: a model that reads the context can predict
every token after the second, so the loss falls well below `log(vocab)` within tens of
steps, which makes "the loss decreases" a meaningful check. Batches depend only on the
seed, the step and the data-parallel rank, so every dispatcher sees the same data.
"""

from __future__ import annotations

import torch

STRIDES = 7  # strides 1..STRIDES


def mock_batch(seed: int, step: int, dp_rank: int, batch: int, seq: int,
               vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(tokens, labels)`, both `[batch, seq]` int64 on CPU; labels are tokens shifted by one."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step * 7919 + dp_rank) % (1 << 62))
    start = torch.randint(0, vocab, (batch, 1), generator=gen)
    stride = torch.randint(1, STRIDES + 1, (batch, 1), generator=gen)
    seqs = (start + stride * torch.arange(seq + 1)) % vocab
    return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()
