"""The switch between the fused kernels and their plain versions (re-exported by :mod:`captioner.kernels`), and
what a fused backward pass asks of autograd (:func:`backward_keeps_graph`).

One process-wide flag, on by default, read when a kernel is called (not when its backward pass runs): set it
around the code to compare, not from several threads at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_fused = True


def fused_enabled() -> bool:
    """Whether the dispatch functions of :mod:`captioner.kernels` take the fused kernels (the default)."""
    return _fused


@contextlib.contextmanager
def fused(enabled: bool) -> Iterator[None]:
    """Within the block, the kernels are fused (``True``) or plain PyTorch (``False``); the flag is restored after."""
    global _fused
    previous, _fused = _fused, bool(enabled)
    try:
        yield
    finally:
        _fused = previous


def backward_keeps_graph() -> bool:
    """Whether the backward pass running now keeps the graph (``retain_graph``), so that a custom autograd node
    must not overwrite the tensors it saved; True where torch cannot say (no such query, or while compiling:
    a traced backward runs again for every later pass)."""
    keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    if keep_graph is None or torch.compiler.is_compiling():
        return True
    return bool(keep_graph())
