"""The contract every decoder keeps: a teacher-forced pass for training and a decode step that
:mod:`captioner.decoding.search` drives.

A decoder is an ``nn.Module`` with

* ``forward(regions, captions) -> TeacherForced``: ``regions`` (B, L, D), ``captions`` (B, T+1) from
  ``<start>``; the output predicts ``captions[:, 1:]``;
* ``init_state(regions) -> state``: a dict of tensors, batch first;
* ``step(tokens, state) -> (log_probs, state, attention)``: ``tokens`` (N,) the previous words, ``log_probs``
  (N, V) for the next (float32; float64 in a float64 model), the new state, and ``{"alpha": (N, L)}`` (hard
  attention: also ``"chosen"``);
* ``fixed_state``: the state entries that depend on the image alone, kept at one row per image while the
  others hold N = B * k rows, each image's adjacent; ``step`` broadcasts them over k = N / B;
* ``samples_locations``: whether it samples one region per word in training (stochastic hard attention,
  :class:`captioner.objectives.losses.HardAttentionLoss`).

:class:`CaptionDecoder` states it as a ``typing.Protocol`` (run-time checkable: the architecture tests check the
registered decoders against it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass
class TeacherForced:
    """A teacher-forced pass over B' captions of T steps.

    ``logits`` (W, V) predict the next words at the W real positions only, in the order of ``targets[mask]``;
    ``alpha`` (B', T, L) each step's attention (rows sum to 1 at real steps, zero at padding; None without
    attention). B' = B, except in hard-attention training, which also sets ``repeats`` (B,) (each caption's
    rows), ``log_prob_location``, ``entropy`` (B', T) and ``expectation_rows`` (B',). Variational attention's
    training sets ``sampled_logits`` (W, V) (the words at the drawn regions), ``log_prob_location`` (log q of
    them), ``kl`` and ``locations`` (B, T).
    """

    logits: torch.Tensor
    alpha: torch.Tensor | None = None
    repeats: torch.Tensor | None = None
    log_prob_location: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    expectation_rows: torch.Tensor | None = None
    sampled_logits: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    locations: torch.Tensor | None = None


@runtime_checkable
class CaptionDecoder(Protocol):
    """What training, every search and evaluation rely on (see the module docstring)."""

    fixed_state: tuple[str, ...]
    samples_locations: bool

    def forward(self, regions: torch.Tensor, captions: torch.Tensor) -> TeacherForced: ...

    def init_state(self, regions: torch.Tensor) -> dict[str, torch.Tensor]: ...

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]: ...
