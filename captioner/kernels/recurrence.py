"""The teacher-forced LSTM's packed recurrence: its shrinking prefixes and its weights' gradients.

The decoder packs W words step-major (step t's ``running[t]`` rows, longest caption first) and carries their
pre-activations in one tensor, the ``carrier`` (W, 4H [+ A] [+ G]); step t adds ``h_{t-1} [W_h; W_q; W_beta]^T``
and ``z_t W_z^T`` to its slice and reads the first ``running[t]`` rows of the per-image tensors (:func:`prefixes`).

:func:`recurrent_terms` and :func:`prefixes` pick the fused or the plain version
(:func:`captioner.kernels.fused_enabled`). The fused ones (:class:`RecurrentTerms`, :class:`Prefixes`) multiply
by detached weights, keep ``h_{t-1}`` and ``z_t`` in a :class:`StepRecord` and take the weights' gradients as one
product over all W words, and add the prefixes' gradients into one buffer; the plain ones leave both to autograd
(T thin products, T full-size accumulations).
"""

from __future__ import annotations

import torch

from captioner.kernels.switch import fused_enabled


class Prefixes(torch.autograd.Function):
    """``tensor[:n]`` for each n of the non-increasing ``sizes``, as one node whose backward adds each prefix's
    gradient in place into one tensor of ``tensor``'s shape."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, sizes: list[int]):
        ctx.shape, ctx.sizes = tensor.shape, sizes
        return tuple(tensor[:n] for n in sizes)

    @staticmethod
    def backward(ctx, *grads):
        total = next(g for g in grads if g is not None).new_zeros(ctx.shape)
        for n, grad in zip(ctx.sizes, grads):
            if grad is not None:
                total[:n] += grad
        return total, None


def prefixes(tensor: torch.Tensor | None, sizes: list[int]) -> list[torch.Tensor | None]:
    """``[tensor[:n] for n in sizes]`` (Nones for a None ``tensor``): one :class:`Prefixes` node when fused and
    ``tensor`` needs a gradient, else plain slices."""
    if tensor is None:
        return [None] * len(sizes)
    if fused_enabled() and tensor.requires_grad and torch.is_grad_enabled():
        return list(Prefixes.apply(tensor, sizes))
    return [tensor[:n] for n in sizes]


class StepRecord:
    """What the steps leave for :class:`RecurrentTerms`'s backward pass: each step's ``h_{t-1}`` and ``z_t`` of its
    running rows, detached, in the packed order."""

    def __init__(self):
        self.hidden: list[torch.Tensor] = []
        self.context: list[torch.Tensor] = []

    def add(self, hidden: torch.Tensor, context: torch.Tensor) -> None:
        """One step's ``h_{t-1}`` (n, H) and ``z_t`` (n, D')."""
        self.hidden.append(hidden.detach())
        self.context.append(context.detach())


def recurrent_terms_plain(input_gates: torch.Tensor, gate_bias: torch.Tensor | None,
                          query_weight: torch.Tensor | None, gate_weight: torch.Tensor | None) -> torch.Tensor:
    """The carrier ``[input_gates | 0 | gate_bias]`` (W, 4H [+ A] [+ G]), by ordinary autograd: zeros when there is
    a query map (``query_weight`` (A, H)), the gate's bias (G,) when there is a gate (``gate_weight`` (G, H))."""
    parts = [input_gates]
    if query_weight is not None:
        parts.append(input_gates.new_zeros(input_gates.shape[0], query_weight.shape[0]))
    if gate_weight is not None:
        parts.append(gate_bias.to(input_gates.dtype).expand(input_gates.shape[0], -1))
    return torch.cat(parts, dim=1)


class RecurrentTerms(torch.autograd.Function):
    """The carrier (:func:`recurrent_terms_plain`) as a node whose backward pass also gives the gradients of the
    weights the steps multiplied by, detached, from the gradient reaching the carrier (word by word that of the
    gates, of the query and of the gate's logit) and the steps' inputs in ``record``:
    ``d[W_z W_h] = d gates^T [z | h_prev]``, ``dW_q = d query^T h_prev``, ``dW_beta = d logit^T h_prev``."""

    @staticmethod
    def forward(ctx, input_gates, gate_bias, recurrent_weight, query_weight, gate_weight, record):
        ctx.record = record
        ctx.sizes = [input_gates.shape[1]] + [w.shape[0] for w in (query_weight, gate_weight) if w is not None]
        ctx.has_query, ctx.has_gate = query_weight is not None, gate_weight is not None
        return recurrent_terms_plain(input_gates, gate_bias, query_weight, gate_weight)

    @staticmethod
    def backward(ctx, grad):
        pieces = list(grad.split(ctx.sizes, dim=1))
        grad_gates = pieces.pop(0)
        grad_bias = grad_recurrent = grad_query = grad_gate = None
        hidden = torch.cat(ctx.record.hidden).to(grad.dtype)                     # (W, H): h_{t-1} per word
        if ctx.needs_input_grad[2]:
            inputs = torch.cat([torch.cat(ctx.record.context).to(grad.dtype), hidden], dim=1)   # (W, D' + H)
            grad_recurrent = grad_gates.t() @ inputs
        if ctx.has_query:
            grad_q = pieces.pop(0)
            if ctx.needs_input_grad[3]:
                grad_query = grad_q.t() @ hidden
        if ctx.has_gate:
            grad_beta = pieces.pop(0)
            if ctx.needs_input_grad[4]:
                grad_gate = grad_beta.t() @ hidden
            if ctx.needs_input_grad[1]:
                grad_bias = grad_beta.sum(0)
        return grad_gates, grad_bias, grad_recurrent, grad_query, grad_gate, None


def recurrent_terms(input_gates: torch.Tensor, gate_bias: torch.Tensor | None, recurrent_weight: torch.Tensor,
                    query_weight: torch.Tensor | None,
                    gate_weight: torch.Tensor | None) -> tuple[torch.Tensor, StepRecord | None]:
    """The carrier (W, 4H [+ A] [+ G]) from ``input_gates`` (W, 4H) and the record the steps must fill, or None.

    A record (fused, :class:`RecurrentTerms`): the steps must multiply by the detached weights
    (``recurrent_weight`` (4H, D' + H), ``query_weight``, ``gate_weight``) and :meth:`StepRecord.add` their inputs.
    None (plain, and wherever no gradient is taken or torch.compile traces the caller: the record is a side channel
    filled after the node's forward, which a traced backward graph cannot see): they multiply by the weights."""
    if fused_enabled() and torch.is_grad_enabled() and not torch.compiler.is_compiling():
        record = StepRecord()
        return RecurrentTerms.apply(input_gates, gate_bias, recurrent_weight, query_weight, gate_weight, record), record
    return recurrent_terms_plain(input_gates, gate_bias, query_weight, gate_weight), None
