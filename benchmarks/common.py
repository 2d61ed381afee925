"""What the benchmark scripts share: the special word indices, random captions of the paper's lengths,
one teacher-forced training step and the CPU's fp32 matrix-multiply peak."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from captioner.training.losses import caption_loss

START, END = 1, 2
VOCAB = 10_000


def random_captions(batch: int, generator: torch.Generator, vocab: int = VOCAB) -> torch.Tensor:
    """``(batch, T+2)`` captions ``<start> w.. <end> <pad>..`` of 10-22 random words each."""
    lengths = torch.randint(10, 23, (batch,), generator=generator)
    captions = torch.zeros(batch, int(lengths.max()) + 2, dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        captions[row, 0] = START
        captions[row, 1 : n + 1] = torch.randint(4, vocab, (n,), generator=generator)
        captions[row, n + 1] = END
    return captions


def training_step(decoder: torch.nn.Module, features: torch.Tensor, optimizer: torch.optim.Optimizer,
                  doubly_stochastic: float) -> Callable[[torch.Tensor], int]:
    """A function that runs one full step (forward, loss, backward, optimizer) of ``decoder`` on ``features``
    (B, L, D) and captions (B, T+2), returning the number of target words."""

    def step(captions: torch.Tensor) -> int:
        out = decoder(features, captions)
        loss = caption_loss(out["logits"], captions[:, 1:], out["alpha"], doubly_stochastic)
        optimizer.zero_grad(set_to_none=True)
        loss["loss"].backward()
        optimizer.step()
        return int(loss["words"])

    return step


def matmul_peak_gflops(size: int = 2048, repeats: int = 10) -> float:
    """GFLOP/s of a large fp32 matrix product on the current threads."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - started) / 1e9
