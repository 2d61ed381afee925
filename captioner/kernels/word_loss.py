"""The word negative log-likelihood of W packed words, with label smoothing's term beside it.

From logits (W, V) and targets (W,), ``p = softmax`` in float32 (float64 logits: in float64):
``-sum_w log p_w(target_w)`` and, when ``uniform`` is set, ``-sum_w mean_v log p_w(v)`` (else 0).
:func:`word_negative_log_likelihood` picks the fused or the plain version (:func:`captioner.kernels.fused_enabled`).
The fused one makes one (W, V) gradient from the saved log-probabilities, in place unless the graph is kept, where
autograd would zero-fill one for the gather and take the exponential again.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from captioner.core.floats import widened
from captioner.kernels.switch import backward_keeps_graph, fused_enabled


def word_negative_log_likelihood_plain(logits: torch.Tensor, targets: torch.Tensor,
                                       uniform: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(nll, spread)`` by ordinary autograd (see the module)."""
    log_probs = F.log_softmax(widened(logits), dim=-1)                     # (W, V)
    nll = -log_probs.gather(1, targets.unsqueeze(1)).sum()
    spread = -log_probs.mean(dim=-1).sum() if uniform else log_probs.new_zeros(())
    return nll, spread


class WordNegativeLogLikelihood(torch.autograd.Function):
    """``(nll, spread)`` as one node; backward ``p (g_nll + g_uniform) - g_nll onehot - g_uniform / V``, ``p`` the
    exponential of the saved log-probabilities. Without ``uniform`` the spread's gradient ``g_uniform`` must be 0
    (it is where nothing reads the spread)."""

    @staticmethod
    def forward(ctx, logits, targets, uniform: bool):
        log_probs = F.log_softmax(widened(logits), dim=-1)                     # (W, V)
        nll = -log_probs.gather(1, targets.unsqueeze(1)).sum()
        spread = -log_probs.mean(dim=-1).sum() if uniform else log_probs.new_zeros(())
        ctx.save_for_backward(log_probs, targets)
        ctx.dtype, ctx.uniform = logits.dtype, uniform
        return nll, spread

    @staticmethod
    def backward(ctx, grad_nll, grad_uniform):
        log_probs, targets = ctx.saved_tensors
        grad = log_probs.exp() if backward_keeps_graph() else log_probs.exp_()
        grad.mul_(grad_nll + grad_uniform)
        grad.scatter_add_(1, targets.unsqueeze(1), (-grad_nll).to(grad.dtype).expand(targets.shape[0], 1))
        if ctx.uniform:
            grad.sub_(grad_uniform / grad.shape[1])
        return grad.to(ctx.dtype), None, None


def word_negative_log_likelihood_fused(logits: torch.Tensor, targets: torch.Tensor,
                                       uniform: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(nll, spread)`` by :class:`WordNegativeLogLikelihood`."""
    return WordNegativeLogLikelihood.apply(logits, targets, uniform)


def word_negative_log_likelihood(logits: torch.Tensor, targets: torch.Tensor,
                                 uniform: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(nll, spread)`` of logits (W, V) and targets (W,), float32 (or float64) scalars: fused or plain as
    :func:`captioner.kernels.fused_enabled` says."""
    if fused_enabled():
        return word_negative_log_likelihood_fused(logits, targets, uniform)
    return word_negative_log_likelihood_plain(logits, targets, uniform)
