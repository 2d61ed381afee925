"""The contract every decoder keeps: a teacher-forced pass for training and a two-method decode-step
interface that the one search implementation (:mod:`captioner.decoding.search`) drives.

A decoder is an ``nn.Module`` with

* ``forward(regions, captions) -> TeacherForced``: ``regions`` (B, L, D), ``captions`` (B, T+1) =
  ``<start> w_1 .. <end> <pad>..``; the output predicts ``captions[:, 1:]``;
* ``init_state(regions) -> state``: the decode state of B images, a dict of tensors whose first dimension
  is the batch (a search reorders or repeats rows with ``index_select(0, ...)``);
* ``step(tokens, state) -> (log_probs, state, attention)``: one word for N rows: ``tokens`` (N,) the previous
  words, ``log_probs`` (N, V) float32 for the next, the new state, and the word's attention maps
  ``{"alpha": (N, L)}`` (plus ``"chosen"`` (N, L) one-hot for hard attention; ``{}`` for none);
* ``fixed_state``: the names of state entries that depend on the image alone (the regions and their
  projections). A search keeps them at one row per image while the other entries hold N = B * k rows (k
  beams or samples per image, each image's rows adjacent): ``step`` broadcasts each image's fixed state over
  its k rows (k = N / B), so nothing image-sized is ever repeated or reordered (a beam search only drops the
  rows of images whose search has ended);
* ``samples_locations``: whether it samples one region per word in training (stochastic hard attention): then
  its training loss is the variational bound trained by REINFORCE
  (:class:`captioner.objectives.losses.HardAttentionLoss`), else the cross-entropy with the attention regulariser,
  and its ``step`` reports the ``"chosen"`` cells.

:class:`CaptionDecoder` states it as a ``typing.Protocol``; ``isinstance`` checks it at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass
class TeacherForced:
    """A teacher-forced pass over B' captions of T steps.

    ``logits`` (W, V) predict the caption's next words at its W real positions only (``captions[:, 1:] !=
    <pad>``, row-major: the order of ``targets[mask]``), so padding costs no output layer; ``alpha``
    (B', T, L) the attention of each step (rows sum to 1 at real steps, zero at padding; None without
    attention). B' = B, except in hard-attention training with M location samples per caption: then
    ``repeats`` (B,) holds the rows of each caption, in a row (M for a caption whose locations are sampled, 1 for
    one on the expectation), and B' their sum. Hard-attention training also fills
    ``log_prob_location`` and ``entropy`` (B', T) (``log alpha`` of the sampled location and the entropy of
    ``alpha``, zero at padding) and ``expectation_rows`` (B',) bool (rows that used ``alpha`` itself).
    ``alpha_heads`` (B', heads, T, L): the Transformer's per-head maps, when asked for.
    """

    logits: torch.Tensor
    alpha: torch.Tensor | None = None
    repeats: torch.Tensor | None = None
    log_prob_location: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    expectation_rows: torch.Tensor | None = None
    alpha_heads: torch.Tensor | None = None


@runtime_checkable
class CaptionDecoder(Protocol):
    """What training, every search and evaluation rely on (see the module docstring)."""

    fixed_state: tuple[str, ...]
    samples_locations: bool

    def forward(self, regions: torch.Tensor, captions: torch.Tensor) -> TeacherForced: ...

    def init_state(self, regions: torch.Tensor) -> dict[str, torch.Tensor]: ...

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]: ...
