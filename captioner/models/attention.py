"""One attention-scoring module for the four classic scoring functions and the no-attention ablation.

Xu et al. (2015) §3.1.2: ``e_ti = f_att(a_i, h_{t-1})`` (eq. 4) and ``alpha_t = softmax(e_t)`` (eq. 5), for regions
``a_i`` (D) and the decoder's previous hidden state ``h`` (H). The scores ``f_att``:

==============  =============================================  ==========================
``additive``    ``w . f(W_a a_i + W_h h)``, f = tanh or ReLU   Bahdanau; Xu et al. §4.2
``dot``         ``(W_a a_i) . (W_h h)``                         Luong "dot", on projections
``scaled_dot``  ``(W_a a_i) . (W_h h) / sqrt(A)``               Vaswani et al.
``general``     ``h . (W a_i)``                                 Luong "general" (bilinear)
``none``        ``0`` for every region (alpha = uniform)       ablation: context = mean
==============  =============================================  ==========================

``alpha = softmax(e)`` over the regions. The additive score's ``f`` is ``tanh`` (the paper's code) or
``relu`` (the popular PyTorch tutorial's). The region side (``W_a a_i``) depends only on the image:
:meth:`RegionAttention.project_regions` computes it once per image.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from captioner.core.floats import widened
from captioner.kernels.additive_score import additive_tanh_scores

SCORES = ("additive", "dot", "scaled_dot", "general", "none")
ACTIVATIONS = ("tanh", "relu")


def attention_entropy(alpha: torch.Tensor) -> torch.Tensor:
    """``-sum_i alpha_i log alpha_i`` (nats) of attention maps ``alpha`` (..., L), in their dtype: (...). A uniform
    map over L regions has ``log L``, one on a single region 0. Half-precision maps are widened first (1e-12 is 0 in
    float16, where ``0 * log 0`` would be NaN)."""
    alpha = widened(alpha)
    return -(alpha * alpha.clamp_min(1e-12).log()).sum(-1)


class RegionAttention(nn.Module):
    """Scores L regions against a query and returns attention weights over them."""

    def __init__(self, score: str, region_dim: int, query_dim: int, attention_dim: int, learned_sharpness: bool = False,
                 activation: str = "tanh"):
        super().__init__()
        if score not in SCORES:
            raise ValueError(f"attention score must be one of {SCORES}, not {score!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"the additive score's activation must be one of {ACTIVATIONS}, not {activation!r}")
        self.score = score
        self.activation = activation
        if score == "additive":
            self.region_proj = nn.Linear(region_dim, attention_dim)
            self.query_proj = nn.Linear(query_dim, attention_dim, bias=False)
            self.energy = nn.Linear(attention_dim, 1)
        elif score in ("dot", "scaled_dot"):
            self.region_proj = nn.Linear(region_dim, attention_dim)
            self.query_proj = nn.Linear(query_dim, attention_dim, bias=False)
        elif score == "general":
            self.region_proj = nn.Linear(region_dim, query_dim, bias=False)
        self.scale = 1.0 / math.sqrt(attention_dim) if score == "scaled_dot" else 1.0
        # exp(log_sharpness) multiplies every score: a learned inverse temperature that Adam can raise far
        # faster than it can grow the score's own weights (off by default: the paper has none)
        self.log_sharpness = nn.Parameter(torch.zeros(())) if learned_sharpness and score != "none" else None

    def project_regions(self, regions: torch.Tensor) -> torch.Tensor | None:
        """Region side of the score, once per image: ``(B, L, D)`` -> ``(B, L, A)`` (None for ``none``)."""
        return None if self.score == "none" else self.region_proj(regions)

    @property
    def query_projection(self) -> nn.Linear | None:
        """The query side's linear map ``W_h`` (None for ``general`` and ``none``): a caller that already computes
        ``W_h h`` beside other maps of the same ``h`` (the LSTM decoder, in one product per step) passes it as
        ``projected_query``."""
        return self.query_proj if self.score in ("additive", "dot", "scaled_dot") else None

    def scores(self, keys: torch.Tensor | None, query: torch.Tensor, num_regions: int,
               projected_query: torch.Tensor | None = None) -> torch.Tensor:
        """Unnormalised scores ``(N, L)`` from projected regions ``keys`` (B, L, A) and queries ``query`` (N, H),
        N = B * k: image b's regions serve its k queries in rows ``b * k`` to ``b * k + k - 1`` (k hypotheses of a
        search; k = 1 in training). ``projected_query`` (N, A): ``query_projection(query)``, when already at hand."""
        rows = query.shape[0]
        if self.score == "none":
            return query.new_zeros(rows, num_regions)
        images = keys.shape[0]
        if projected_query is not None:
            q = projected_query
        else:
            q = query if self.score == "general" else self.query_proj(query)
        q = q.view(images, rows // images, -1)                                      # (B, k, A)
        if self.score == "additive":   # e_ti = w . f(W_a a_i + W_h h) + b
            if self.activation == "tanh":
                return additive_tanh_scores(keys, q, self.energy.weight, self.energy.bias).reshape(rows, num_regions)
            hidden = torch.relu_(keys.unsqueeze(1) + q.unsqueeze(2))                 # (B, k, L, A), in place on the fresh sum
            return self.energy(hidden).reshape(rows, num_regions)
        return torch.bmm(q, keys.transpose(1, 2)).reshape(rows, num_regions) * self.scale

    def sharpened_scores(self, keys: torch.Tensor | None, query: torch.Tensor, num_regions: int,
                         projected_query: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`scores` times the learned sharpness (if any), in float32 or wider: ``e_t`` (N, L), eq. 4."""
        scores = self.scores(keys, query, num_regions, projected_query)
        if self.log_sharpness is not None:
            scores = scores * self.log_sharpness.exp()
        return widened(scores)

    def forward(self, keys: torch.Tensor | None, query: torch.Tensor, num_regions: int,
                projected_query: torch.Tensor | None = None) -> torch.Tensor:
        """Attention weights ``alpha`` (N, L) of N = B * k queries over B images' regions (see :meth:`scores`),
        summing to 1 over the regions, in ``query``'s dtype. ``projected_query``: see :meth:`scores`.
        """
        scores = self.sharpened_scores(keys, query, num_regions, projected_query)
        return torch.softmax(scores, dim=-1).to(query.dtype)                     # alpha_t, eq. 5

    def log_weights(self, keys: torch.Tensor | None, query: torch.Tensor, num_regions: int,
                    projected_query: torch.Tensor | None = None) -> torch.Tensor:
        """``log alpha`` (N, L) in float32 or wider (see :meth:`forward`), for the terms that take alpha's log (a
        sampled location's log-probability, the entropy, a KL): exact where alpha itself is below what its dtype
        holds (float16's smallest is 6e-8), and with a gradient there, which the log of a clamped alpha has not."""
        return torch.log_softmax(self.sharpened_scores(keys, query, num_regions, projected_query), dim=-1)
