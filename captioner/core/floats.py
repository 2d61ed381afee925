"""Denormal floats flushed to zero on the CPU, in every thread torch computes on."""

from __future__ import annotations

import torch


def flush_denormals() -> bool:
    """Treat denormal floats (below ~1.2e-38 in float32) as zero in this thread and in the threads it starts later.

    A trained model's tiny activations, gradients and Adam moments fall into that range, where x86 arithmetic takes
    many times longer per operation; flushed, they are zero, far below anything a caption depends on. The flag lives
    in each thread's control register and new threads inherit it, so it must be set before torch's thread pool
    exists: a command calls this first, before any parallel torch operation (set later, it reaches the calling
    thread only). Returns False where the CPU has no such flag (set by SSE3 on x86, by FZ on ARM)."""
    return torch.set_flush_denormal(True)


def widened(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 where autocast computed it in half precision (float16, bfloat16), else as it is: the
    precision that softmax, log-probabilities and sums over a caption are taken in (float64 stays float64)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
