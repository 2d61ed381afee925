"""Training objective of the soft-attention decoder: word cross-entropy plus the doubly stochastic term."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def caption_loss(logits: torch.Tensor, targets: torch.Tensor, alpha: torch.Tensor | None,
                 doubly_stochastic: float, pad_index: int = 0) -> dict[str, torch.Tensor]:
    """Loss of a teacher-forced batch.

    ``logits`` (B, T, V) predict ``targets`` (B, T); positions where ``targets == pad_index`` never count.
    ``cross_entropy`` is the mean over real words. ``attention`` is ``lambda * sum_i (1 - sum_t alpha_ti)^2``
    (Xu et al. eq. 14) with the sum over real steps only, averaged over captions. ``alpha`` (B, T, L).
    """
    mask = targets != pad_index
    cross_entropy = F.cross_entropy(logits[mask].float(), targets[mask])
    out = {"cross_entropy": cross_entropy, "words": mask.sum()}
    if alpha is not None and doubly_stochastic > 0:
        coverage = (alpha.float() * mask.unsqueeze(-1)).sum(dim=1)             # (B, L)
        out["attention"] = doubly_stochastic * ((1.0 - coverage) ** 2).sum(dim=1).mean()
        out["loss"] = cross_entropy + out["attention"]
    else:
        out["loss"] = cross_entropy
    return out
