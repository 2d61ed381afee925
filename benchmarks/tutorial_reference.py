"""A reference of the common PyTorch tutorial design of a Show, Attend and Tell decoder, written for measuring:
the speed benchmarks run it beside captioner's decoder on the same captions and regions, one step of each in
turn, and report the ratio. It is not used anywhere else and is not a model to train.

What makes the design what it is (and what captioner does instead):

* the attention projects the regions ``W_a a_i`` again at every word (captioner: once per image);
* an ``nn.LSTMCell`` over ``[E y_{t-1}; z_t]`` at every word (captioner: the embedding part of the gates for all
  words at once, the recurrent part per word);
* a shrinking batch over captions sorted by length (the same in captioner);
* a vector gate ``beta = sigmoid(f_beta(h))`` of the context's size, ReLU inside the additive score;
* the output layer ``fc(dropout(h_t))`` per word, no deep output (captioner: the deep output layer, once per
  caption over all steps);
* the cross-entropy of the packed real positions plus ``alpha_c * mean((1 - sum_t alpha_ti)^2)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TutorialDecoder(nn.Module):
    """The tutorial design at the given sizes: regions (B, L, D), captions (B, T+1) sorted or not."""

    def __init__(self, vocab_size: int, region_dim: int = 512, attention_dim: int = 512, embed_dim: int = 512,
                 hidden_dim: int = 512, dropout: float = 0.5):
        super().__init__()
        self.region_att = nn.Linear(region_dim, attention_dim)
        self.hidden_att = nn.Linear(hidden_dim, attention_dim)
        self.score = nn.Linear(attention_dim, 1)
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.cell = nn.LSTMCell(embed_dim + region_dim, hidden_dim)
        self.init_h = nn.Linear(region_dim, hidden_dim)
        self.init_c = nn.Linear(region_dim, hidden_dim)
        self.f_beta = nn.Linear(hidden_dim, region_dim)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(hidden_dim, vocab_size)

    def attend(self, regions: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.score(F.relu(self.region_att(regions) + self.hidden_att(h).unsqueeze(1))).squeeze(2)
        alpha = scores.softmax(dim=1)
        return (regions * alpha.unsqueeze(2)).sum(dim=1), alpha

    def forward(self, regions: torch.Tensor, captions: torch.Tensor):
        """``(scores (B, T, V), targets (B, T), decode_lengths, alphas (B, T, L))`` with rows sorted by length."""
        lengths = (captions != 0).sum(dim=1)
        lengths, order = lengths.sort(descending=True)
        regions, captions = regions[order], captions[order]
        decode_lengths = (lengths - 1).tolist()
        embedded = self.embedding(captions)
        mean = regions.mean(dim=1)
        h, c = self.init_h(mean), self.init_c(mean)
        steps = max(decode_lengths)
        scores = regions.new_zeros(len(order), steps, self.fc.out_features)
        alphas = regions.new_zeros(len(order), steps, regions.shape[1])
        for t in range(steps):
            rows = sum(length > t for length in decode_lengths)
            context, alpha = self.attend(regions[:rows], h[:rows])
            context = torch.sigmoid(self.f_beta(h[:rows])) * context
            h, c = self.cell(torch.cat([embedded[:rows, t], context], dim=1), (h[:rows], c[:rows]))
            scores[:rows, t] = self.fc(self.dropout(h))
            alphas[:rows, t] = alpha
        return scores, captions[:, 1:], decode_lengths, alphas


def tutorial_loss(scores, targets, decode_lengths, alphas, alpha_c: float = 1.0) -> torch.Tensor:
    """Cross-entropy of the packed real positions plus the tutorial's doubly stochastic term."""
    packed_scores = nn.utils.rnn.pack_padded_sequence(scores, decode_lengths, batch_first=True).data
    packed_targets = nn.utils.rnn.pack_padded_sequence(targets, decode_lengths, batch_first=True).data
    return F.cross_entropy(packed_scores, packed_targets) + alpha_c * ((1.0 - alphas.sum(dim=1)) ** 2).mean()
