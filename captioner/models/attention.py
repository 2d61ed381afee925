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
import torch.nn.functional as F
from torch import nn

from captioner.utils import backward_keeps_graph

SCORES = ("additive", "dot", "scaled_dot", "general", "none")


def _additive_sigmoid_and_scores(keys, query, weight, bias):
    """``(s, scores)`` for keys (B, L, A) and queries (B, k, A), without gradient tracking: ``s = sigmoid(2 (k_i +
    q))`` (B, k, L, A) in one fresh tensor, and the additive score ``w . tanh(k_i + q) + b`` (B, k, L) from it.

    ``tanh(x) = 2 sigmoid(2x) - 1`` (the same function to float rounding, 2e-7), and the affine map moves onto the
    scores: ``w . tanh = 2 (w . s) - sum(w)``. (Chosen when torch's CPU tanh cost about ten times its sigmoid. In
    torch 2.14.1 the tanh kernel is the quicker, 1.4x natively and 2.2x held to AVX2 on a (32, 196, 512) tensor, yet
    a step with ``tanh_`` in place of the sigmoid, and ``tanh_backward``, trained no faster, interleaved in one
    process: 1.01x at the demo's sizes, 0.96x and 1.00x at D = 512 as AVX2 and natively.)
    The largest tensor of a training or decoding step is thus made by two passes over memory (the doubled sum
    ``2 query + 2 keys`` in one kernel, exactly ``2 (keys + query)``, then the sigmoid in place) and read once,
    where the tanh itself would take two passes more. In reduced precision (autocast) the product is taken of
    ``2 s - 1`` instead, so that it is rounded at the scale of the score rather than of ``w . s``."""
    s = torch.add(query.unsqueeze(2) * 2, keys.unsqueeze(1), alpha=2).sigmoid_()
    if s.dtype in (torch.float16, torch.bfloat16):
        with torch.autocast(keys.device.type, enabled=False):
            return s, F.linear(s * 2 - 1, weight.to(s.dtype), None if bias is None else bias.to(s.dtype)).squeeze(-1)
    offset = -weight.sum() if bias is None else bias - weight.sum()
    return s, torch.addmm(offset, s.view(-1, s.shape[-1]), weight.view(-1, 1), alpha=2).view(s.shape[:-1])


class _AdditiveTanhScore(torch.autograd.Function):
    """The additive score ``e = w . tanh(k_i + q) + b`` (B, k, L) of keys (B, L, A) against queries (B, k, A) as
    one autograd node. Its ``(B, k, L, A)`` tensor ``s = sigmoid(2 (k_i + q))``, the largest of a training step,
    is made and saved once (:func:`_additive_sigmoid_and_scores`); the backward pass takes ``dw = sum grad (2 s -
    1)`` from it, then turns it in place (unless the graph is kept for another backward pass) into ``grad * w *
    tanh'`` with ``tanh'(x) = 1 - tanh(x)^2 = 4 s (1 - s)``: two passes over memory already there, where torch's
    own graph makes a matrix product of inner size 1 (which the CPU BLAS runs several times slower than a
    broadcast product) and a fresh ``tanh'`` tensor."""

    @staticmethod
    def forward(ctx, keys, query, weight, bias):
        s, scores = _additive_sigmoid_and_scores(keys, query, weight, bias)
        ctx.save_for_backward(s, weight)
        ctx.has_bias = bias is not None
        return scores

    @staticmethod
    def backward(ctx, grad):
        s, weight = ctx.saved_tensors
        size = s.shape[-1]
        grad = grad.to(s.dtype)
        column = grad.reshape(-1, 1)                                                 # (B k L, 1)
        flat = s.view(-1, size)
        grad_keys = grad_query = grad_weight = grad_bias = None
        if ctx.needs_input_grad[2]:   # sum of grad * s: image by image (a batched product; one matrix-vector
            # product over all rows is a single thread's work in MKL), then over the images
            grad_s = torch.bmm(grad.reshape(s.shape[0], 1, -1), s.view(s.shape[0], -1, size)).sum(0)
            exact = torch.promote_types(s.dtype, torch.float32)                     # bf16 and fp16 summed in fp32
            grad_weight = (grad_s.to(exact) * 2 - grad.to(exact).sum()).to(weight.dtype)   # sum of grad * tanh
        if ctx.has_bias and ctx.needs_input_grad[3]:
            grad_bias = grad.sum().reshape(1)
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            w = weight.to(s.dtype).view(1, -1) * 4
            if backward_keeps_graph():
                d = torch.mul(w, column)                                             # d e / d tanh, times 4
                torch.ops.aten.sigmoid_backward.grad_input(d, flat, grad_input=d)   # * s (1 - s)
            else:
                d = torch.ops.aten.sigmoid_backward.grad_input(w.expand_as(flat), flat, grad_input=flat).mul_(column)
            d = d.view(s.shape)
            if ctx.needs_input_grad[0]:
                grad_keys = d.squeeze(1) if d.shape[1] == 1 else d.sum(1)
            if ctx.needs_input_grad[1]:
                grad_query = d.sum(2)
        return grad_keys, grad_query, grad_weight, grad_bias


def additive_tanh_scores(keys: torch.Tensor, query: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None) -> torch.Tensor:
    """``w . tanh(k_i + q) + b`` (B, k, L) of keys (B, L, A) and queries (B, k, A): one autograd node
    (:class:`_AdditiveTanhScore`) when a gradient is needed."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (keys, query, weight, bias)):
        return _AdditiveTanhScore.apply(keys, query, weight, bias)
    return _additive_sigmoid_and_scores(keys, query, weight, bias)[1]


ACTIVATIONS = ("tanh", "relu")


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
        if self.score == "additive":
            if self.activation == "tanh":
                return additive_tanh_scores(keys, q, self.energy.weight, self.energy.bias).reshape(rows, num_regions)
            hidden = torch.relu_(keys.unsqueeze(1) + q.unsqueeze(2))                 # (B, k, L, A), in place on the fresh sum
            return self.energy(hidden).reshape(rows, num_regions)
        return torch.bmm(q, keys.transpose(1, 2)).reshape(rows, num_regions) * self.scale

    def forward(self, keys: torch.Tensor | None, query: torch.Tensor, num_regions: int,
                mask: torch.Tensor | None = None, projected_query: torch.Tensor | None = None) -> torch.Tensor:
        """Attention weights ``alpha`` (N, L) of N = B * k queries over B images' regions (see :meth:`scores`),
        summing to 1 over valid regions. ``mask`` (N, L) bool marks valid regions; masked regions get exactly
        zero weight. ``projected_query``: see :meth:`scores`.
        """
        scores = self.scores(keys, query, num_regions, projected_query)
        if self.log_sharpness is not None:
            scores = scores * self.log_sharpness.exp()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores.float(), dim=-1).to(query.dtype)
