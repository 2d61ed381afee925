"""What the benchmark scripts share: the special word indices, random captions of the paper's lengths
and the CPU's fp32 matrix-multiply peak."""

from __future__ import annotations

import time

import torch

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


def matmul_peak_gflops(size: int = 2048, repeats: int = 10) -> float:
    """GFLOP/s of a large fp32 matrix product on the current threads."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - started) / 1e9
