"""One attention-scoring module for the four classic scoring functions and the no-attention ablation.

Scores ``e_i`` of region ``a_i`` (D) against a query ``h`` (H, the decoder's previous hidden state):

==============  =============================================  ==========================
``additive``    ``w . f(W_a a_i + W_h h)``, f = tanh or ReLU   Bahdanau; Xu et al. §4.2
``dot``         ``(W_a a_i) . (W_h h)``                         Luong "dot", on projections
``scaled_dot``  ``(W_a a_i) . (W_h h) / sqrt(A)``               Vaswani et al.
``general``     ``h . (W a_i)``                                 Luong "general" (bilinear)
``none``        ``0`` for every region (alpha = uniform)       ablation: context = mean
==============  =============================================  ==========================

``alpha = softmax(e)`` over the valid regions. The additive score's nonlinearity ``f`` is ``tanh`` (the paper's
code) or ``relu`` (the popular PyTorch tutorial's): tanh bounds every hidden unit, so the score range can only
grow through ``w``; ReLU leaves it unbounded. The region side (``W_a a_i``) depends only on the image,
so :meth:`RegionAttention.project_regions` computes it once per image and every decoding step reuses it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

SCORES = ("additive", "dot", "scaled_dot", "general", "none")


class _SigmoidTanh(torch.autograd.Function):
    """``tanh(x) = 2 sigmoid(2x) - 1`` with tanh's own backward (``grad * (1 - y^2)``, from the output alone)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        y = torch.sigmoid(x * 2).mul_(2).sub_(1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def tanh_(x: torch.Tensor) -> torch.Tensor:
    """``tanh(x)``, in place on ``x`` when no gradient flows. On a CPU as ``2 sigmoid(2x) - 1``, the same function
    to float rounding (2e-7): torch's CPU tanh, exact to 1 ulp, costs about ten times its sigmoid, and the
    additive score's ``(B, k, L, A)`` tensor is the largest of every training and decoding step (forward and
    backward of the activation: ~3x faster)."""
    if x.device.type != "cpu":
        return torch.tanh_(x)
    if x.requires_grad and torch.is_grad_enabled():
        return _SigmoidTanh.apply(x)
    return x.mul_(2).sigmoid_().mul_(2).sub_(1)


# in place on the fresh sum: one pass less over the (B, k, L, A) tensor, the largest of a decoding step
ACTIVATIONS = {"tanh": tanh_, "relu": torch.relu_}


class RegionAttention(nn.Module):
    """Scores L regions against a query and returns attention weights over them."""

    def __init__(self, score: str, region_dim: int, query_dim: int, attention_dim: int, learned_sharpness: bool = False,
                 activation: str = "tanh"):
        super().__init__()
        if score not in SCORES:
            raise ValueError(f"attention score must be one of {SCORES}, not {score!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"the additive score's activation must be one of {tuple(ACTIVATIONS)}, not {activation!r}")
        self.score = score
        self.activation = ACTIVATIONS[activation]
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

    def scores(self, keys: torch.Tensor | None, query: torch.Tensor, num_regions: int) -> torch.Tensor:
        """Unnormalised scores ``(N, L)`` from projected regions ``keys`` (B, L, A) and queries ``query`` (N, H),
        N = B * k: image b's regions serve its k queries in rows ``b * k`` to ``b * k + k - 1`` (k hypotheses of a
        search; k = 1 in training)."""
        rows = query.shape[0]
        if self.score == "none":
            return query.new_zeros(rows, num_regions)
        images = keys.shape[0]
        q = query if self.score == "general" else self.query_proj(query)
        q = q.view(images, rows // images, -1)                                      # (B, k, A)
        if self.score == "additive":
            hidden = self.activation(keys.unsqueeze(1) + q.unsqueeze(2))             # (B, k, L, A)
            return self.energy(hidden).reshape(rows, num_regions)
        return torch.bmm(q, keys.transpose(1, 2)).reshape(rows, num_regions) * self.scale

    def forward(self, keys: torch.Tensor | None, query: torch.Tensor, num_regions: int,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention weights ``alpha`` (N, L) of N = B * k queries over B images' regions (see :meth:`scores`),
        summing to 1 over valid regions. ``mask`` (N, L) bool marks valid regions; masked regions get exactly
        zero weight.
        """
        scores = self.scores(keys, query, num_regions)
        if self.log_sharpness is not None:
            scores = scores * self.log_sharpness.exp()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(query.dtype)
