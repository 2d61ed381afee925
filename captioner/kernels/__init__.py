"""Fused autograd kernels, each beside a plain PyTorch version of the same computation.

A module per computation: :mod:`captioner.kernels.recurrence` (the teacher-forced LSTM's shrinking prefixes and
one-product weight gradients), :mod:`captioner.kernels.additive_score` (the additive tanh score),
:mod:`captioner.kernels.word_loss` (the word negative log-likelihood). Each holds the fused version (a
``torch.autograd.Function`` with a hand-written backward pass), the plain one (ordinary autograd), and the
dispatch function the models and losses call, which picks one by :func:`fused_enabled`. The two agree to float
rounding; ``with fused(False):`` runs the plain versions, to read, to test against, or to rule a kernel out.
"""

from captioner.kernels.switch import fused, fused_enabled

__all__ = ["fused", "fused_enabled"]
