"""The additive tanh score ``e = w . tanh(k_i + q) + b`` of keys (B, L, A) against queries (B, k, A) -> (B, k, L).

:func:`additive_tanh_scores` picks :func:`additive_tanh_scores_fused` or :func:`additive_tanh_scores_plain`
(:func:`captioner.kernels.fused_enabled`). The fused one computes ``tanh(x) = 2 sigmoid(2x) - 1`` (equal to float
rounding) and saves one (B, k, L, A) tensor, ``sigmoid(2 (k_i + q))``, instead of two; its backward pass reuses that
tensor in place unless the graph is kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from captioner.core.floats import widened
from captioner.kernels.switch import backward_keeps_graph, fused_enabled


def additive_tanh_scores_plain(keys: torch.Tensor, query: torch.Tensor, weight: torch.Tensor,
                               bias: torch.Tensor | None) -> torch.Tensor:
    """``w . tanh(k_i + q) + b`` (B, k, L) of keys (B, L, A) and queries (B, k, A), by ordinary autograd."""
    return F.linear(torch.tanh(keys.unsqueeze(1) + query.unsqueeze(2)), weight, bias).squeeze(-1)


def sigmoid_and_scores(keys, query, weight, bias):
    """``(s, scores)`` without gradient tracking: ``s = sigmoid(2 (k_i + q))`` (B, k, L, A), made in one fresh
    tensor (the doubled sum, then the sigmoid in place), and the score from it, ``2 (w . s) - sum(w) + b`` (B, k, L).
    In reduced precision the product is taken of ``2 s - 1``, rounded at the scale of the score."""
    s = torch.add(query.unsqueeze(2) * 2, keys.unsqueeze(1), alpha=2).sigmoid_()
    if s.dtype in (torch.float16, torch.bfloat16):
        with torch.autocast(keys.device.type, enabled=False):
            return s, F.linear(s * 2 - 1, weight.to(s.dtype), None if bias is None else bias.to(s.dtype)).squeeze(-1)
    offset = -weight.sum() if bias is None else bias - weight.sum()
    return s, torch.addmm(offset, s.view(-1, s.shape[-1]), weight.view(-1, 1), alpha=2).view(s.shape[:-1])


class AdditiveTanhScore(torch.autograd.Function):
    """The additive score as one autograd node that saves ``s`` (:func:`sigmoid_and_scores`) alone. Backward:
    ``dw = sum grad (2 s - 1)`` per image, then ``d/d(k_i + q) = grad * w * 4 s (1 - s)`` (``tanh'``), in place
    in ``s`` unless the graph is kept."""

    @staticmethod
    def forward(ctx, keys, query, weight, bias):
        s, scores = sigmoid_and_scores(keys, query, weight, bias)
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
        if ctx.needs_input_grad[2]:   # sum of grad * s: image by image (a batched product), then over the images
            grad_s = torch.bmm(grad.reshape(s.shape[0], 1, -1), s.view(s.shape[0], -1, size)).sum(0)
            # sum of grad * tanh, bf16 and fp16 summed in fp32
            grad_weight = (widened(grad_s) * 2 - widened(grad).sum()).to(weight.dtype)
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


def additive_tanh_scores_fused(keys: torch.Tensor, query: torch.Tensor, weight: torch.Tensor,
                               bias: torch.Tensor | None) -> torch.Tensor:
    """:func:`additive_tanh_scores_plain` by :class:`AdditiveTanhScore` when a gradient is needed, else by
    :func:`sigmoid_and_scores`."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (keys, query, weight, bias)):
        return AdditiveTanhScore.apply(keys, query, weight, bias)
    return sigmoid_and_scores(keys, query, weight, bias)[1]


def additive_tanh_scores(keys: torch.Tensor, query: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None) -> torch.Tensor:
    """``w . tanh(k_i + q) + b`` (B, k, L) of keys (B, L, A) and queries (B, k, A), ``weight`` (1, A), ``bias`` (1,)
    or None: fused or plain as :func:`captioner.kernels.fused_enabled` says."""
    if fused_enabled():
        return additive_tanh_scores_fused(keys, query, weight, bias)
    return additive_tanh_scores_plain(keys, query, weight, bias)
