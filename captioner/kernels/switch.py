"""The switch between the fused kernels and their plain versions (re-exported by :mod:`captioner.kernels`).

One process-wide flag, on by default, read when a kernel is called (not when its backward pass runs): set it
around the code to compare, not from several threads at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
