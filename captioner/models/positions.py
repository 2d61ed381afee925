"""Fixed sinusoidal position codes: of word positions (1-D) and of the cells of a region grid (2-D).

One grid code serves both decoders: the LSTM appends it to each region, the Transformer adds it to the
projected regions (``region_position=sinusoidal``).
"""

from __future__ import annotations

import math

import torch

MAX_GRID_FREQUENCY = 256.0
"""The grid code's highest frequency, in multiples of pi per image side."""


def sinusoidal_code(positions: int, dim: int) -> torch.Tensor:
    """The Transformer's word-position code ``(positions, dim)``: sines then cosines of ``p / 10000^(2i/dim)``."""
    if dim % 2:
        raise ValueError(f"a sinusoidal code needs an even size, got {dim}")
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(0, dim, 2, dtype=torch.get_default_dtype()) / dim)
    angles = torch.arange(positions, dtype=torch.get_default_dtype())[:, None] * freqs[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def grid_code(grid: tuple[int, int], dim: int) -> torch.Tensor:
    """A 2-D code ``(L, dim)`` for a ``gh x gw`` grid in row-major order: the row's code in the first half,
    the column's in the second.

    Each half holds sines and cosines of the cell centre's coordinate ``(i + 0.5) / n`` at ``K = dim // 4``
    geometric frequencies from ``pi``, at most ``pi * MAX_GRID_FREQUENCY``: nearby cells get similar codes,
    every cell a distinct one, whatever the grid's size.
    """
    if dim % 4:
        raise ValueError(f"a 2-D position code needs a size that is a multiple of 4, got {dim}")
    gh, gw = grid
    count = dim // 4
    spacing = min(1.0, math.log2(MAX_GRID_FREQUENCY) / max(count - 1, 1))
    freqs = math.pi * 2.0 ** (torch.arange(count, dtype=torch.get_default_dtype()) * spacing)

    def encode(n: int) -> torch.Tensor:
        coords = (torch.arange(n, dtype=torch.get_default_dtype()) + 0.5) / n
        angles = coords[:, None] * freqs[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    rows, cols = encode(gh), encode(gw)
    return torch.cat([rows[:, None, :].expand(gh, gw, -1), cols[None, :, :].expand(gh, gw, -1)], dim=-1).reshape(gh * gw, dim)
