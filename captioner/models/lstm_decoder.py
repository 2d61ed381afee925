"""The Show, Attend and Tell LSTM decoder (Xu et al. 2015): soft (§4.2), hard (§4.1) or marginal attention.

Regions ``a`` (B, L, D'); at step t, from the previous word ``y_{t-1}`` and state ``h_{t-1}, c_{t-1}``:

    e_ti = f_att(a_i, h_{t-1}),  alpha_t = softmax_i(e_t)         eq. 4, 5
    z_t  = beta_t * phi({a_i}, {alpha_ti})                         eq. 6
           soft: sum_i alpha_ti a_i                                eq. 13
           hard: a_{s_t}, s_t ~ Multinoulli(alpha_t)               eq. 8, 9
    beta_t = sigmoid(f_beta(h_{t-1}))                              §4.2.1
    i, f, o, g = sigmoid, sigmoid, sigmoid, tanh of W [E y_{t-1}; z_t; h_{t-1}] + b          eq. 1
    c_t = f * c_{t-1} + i * g,  h_t = o * tanh(c_t)                eq. 2, 3
    p(y_t | a, y_1^{t-1}) ∝ exp(L_o dropout(tanh(E y_{t-1} + L_h h_t + L_z z_t)))   eq. 7

``h_0, c_0`` are tanh MLPs of the mean region (§3.1.2). Hard attention trains with
:class:`captioner.objectives.losses.HardAttentionLoss` and picks its locations at inference by ``hard_decode``.

Marginal attention takes the paper's latent variable s_t (one region per word) and sums it out exactly instead of
sampling it (Deng et al. 2018, "Latent Alignment and Variational Attention"): the recurrence reads the soft context
z_t, and the word distribution is the mixture over regions of eq. 7 with z_t = beta_t a_i,

    p(y_t | a, y_1^{t-1}) = sum_i alpha_ti p(y_t | a_i, h_t, y_{t-1})

so the likelihood needs no estimator; over the ``marginal_regions`` regions of highest alpha_t only, if set, which
bounds the output layer's cost at that many evaluations per word: alpha_t renormalised over them, or, with
``marginal_rest: soft``, one more component, the soft context of the other regions at the rest of alpha_t's mass,

    p(y_t) = sum_{i in top k} alpha_ti p(y_t | a_i) + r_t p(y_t | sum_{i not in top k} alpha_ti a_i / r_t)

with r_t = sum_{i not in top k} alpha_ti, so that moving mass onto a region that predicts the word pays.

Variational attention (Deng et al. 2018) keeps the latent region and trains it by REINFORCE with a better proposal:
a posterior q_t over the regions, scored from h_{t-1} and a bidirectional LSTM's reading of the whole caption at
word t, proposes s_t ~ q_t; the word term log p(y_t | a_{s_t}) trains the decoder, its excess over the soft context's
log p(y_t | z_t) rewards q, and KL(q_t || alpha_t), exact over the L regions, trains alpha (see
:class:`captioner.objectives.losses.VariationalAttentionLoss`). The recurrence reads the soft context, and so does
decoding: q needs the caption, which decoding does not have.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from captioner.core.floats import widened
from captioner.core.settings import check_settings, setting
from captioner.data.tokens import PAD_INDEX
from captioner.kernels.recurrence import StepRecord, prefixes, recurrent_terms
from captioner.models.attention import ACTIVATIONS, SCORES, RegionAttention
from captioner.models.decoder import TeacherForced
from captioner.models.positions import grid_code


@dataclass
class LSTMDecoderConfig:
    """The ``model.lstm`` settings, and the sizes the data and the encoder give (filled when the model is built)."""

    vocab_size: int = 0                 # V, from the vocabulary
    region_dim: int = 0                 # D, the encoder's feature size
    grid: tuple[int, int] = (0, 0)      # (gh, gw), L = gh * gw
    attention: str = setting("additive", "additive | dot | scaled_dot | general | none (context = mean of regions)",
                             choices=SCORES)
    score_activation: str = setting("tanh", "additive score: w . f(W_a a + W_h h) with f = tanh (the paper) | relu",
                                    choices=ACTIVATIONS)
    attention_mode: str = setting(
        "soft", "soft | hard (stochastic hard attention trained with REINFORCE) | marginal (one region per word summed "
        "out exactly: p(y_t) = sum_i alpha_ti p(y_t | a_i), no estimator) | variational (one region per word drawn "
        "from a posterior that also reads the caption, trained by REINFORCE against the soft context, with the exact "
        "KL to alpha; decodes with the soft context)", choices=("soft", "hard", "marginal", "variational"))
    attention_dim: int = setting(512, "A: size of the projected regions and query in the score", minimum=1)
    embed_dim: int = setting(512, "word embedding size (and of the deep output layer)", minimum=1)
    hidden_dim: int = setting(512, "LSTM state size", minimum=1)
    dropout: float = setting(0.5, "before the output layer", minimum=0, below=1)
    word_dropout: float = setting(0.0, "on the word embeddings E y_{t-1}, wherever they are read", minimum=0, below=1)
    region_embed: int = setting(
        0, "size of a learned map of each region, ReLU(W_e a_i + b_e) after region_norm, that everything then reads in "
        "place of the features (the self-critical code base's att_embed); 0: none, the features are read as they are",
        minimum=0)
    region_dropout: float = setting(0.0, "on the regions (after region_norm and region_embed), before anything reads "
                                    "them", minimum=0, below=1)
    gate: str = setting("scalar", "scalar | vector | none (the paper's beta gate)",
                        choices=("scalar", "vector", "none"))
    learned_sharpness: bool = setting(False, "a learned inverse temperature exp(s) on the attention scores")
    region_norm: str = setting(
        "none", "none | layer: LayerNorm over each region's features before anything reads them | image: the image's "
        "whole map divided by its root mean square (one scale per image, so the regions keep their relative "
        "strengths), with a gain and a bias per feature", choices=("none", "layer", "image"))
    region_position: str = setting("none", "none | sinusoidal: a grid position code appended to each region",
                                   choices=("none", "sinusoidal"))
    position_dim: int = setting(32, "size of that code (a multiple of 4)", minimum=4)
    hard_decode: str = setting(
        "argmax", "hard attention at inference: argmax (one cell) | sample (a drawn cell) | expectation (alpha's "
        "mean of the regions, as the expectation rows of training)", choices=("argmax", "sample", "expectation"))
    expectation_probability: float = setting(
        0.5, "hard training: a caption uses alpha instead of a sample (paper: 0.5)", minimum=0, maximum=1)
    expectation_draw: str = setting(
        "caption", "hard training: that choice drawn for each caption | batch: once per training step for all its "
        "captions (the paper's code, capgen.py; under torchrun, once per process)", choices=("caption", "batch"))
    location_samples: int = setting(1, "hard training: location samples drawn per caption", minimum=1)
    posterior_dim: int = setting(
        256, "variational attention: size of each direction of the LSTM that reads the caption for the posterior",
        minimum=1)
    marginal_regions: int = setting(
        0, "marginal attention: the regions in each word's mixture, those of highest alpha (alpha renormalised over "
        "them, or see marginal_rest); 0: all L, the exact marginal likelihood", minimum=0)
    marginal_rest: str = setting(
        "renormalise", "marginal attention over marginal_regions regions: renormalise (alpha renormalised over them, "
        "so the likelihood cannot ask alpha to move mass onto them) | soft (one more component: the rest of alpha's "
        "mass on the soft context of the other regions; exact when one region is left)",
        choices=("renormalise", "soft"))

    @property
    def samples_locations(self) -> bool:
        """Stochastic hard attention (§4.1): one region per word, sampled in training."""
        return self.attention_mode == "hard"

    def check(self) -> None:
        """Each setting's type, choices and bounds, then the settings that depend on one another (a ValueError
        names the one that does not fit)."""
        check_settings(self, "model.lstm")
        if self.attention_mode != "soft" and self.attention == "none":  # hard, marginal and variational read alpha
            raise ValueError(f"{self.attention_mode} attention needs an attention score (attention must not be none)")
        if self.region_position == "sinusoidal" and self.position_dim % 4:
            raise ValueError(f"position_dim must be a multiple of 4 for a 2-D position code, got {self.position_dim}")


def _unpack(packed: torch.Tensor, to_packed: torch.Tensor) -> torch.Tensor:
    """Packed rows ``(W, ...)`` -> ``(B, T, ...)`` by ``to_packed`` (B, T), the packed row of each position, W at
    padding (where the result is zero)."""
    padded = torch.cat([packed, packed.new_zeros(1, *packed.shape[1:])])
    return padded.index_select(0, to_packed.reshape(-1)).view(*to_packed.shape, *packed.shape[1:])


def packed_rows(running: list[int], device: torch.device) -> torch.Tensor:
    """The sorted row (image) of each packed word (W,): step t's words are rows 0 .. ``running[t]`` - 1."""
    return torch.cat([torch.arange(n, device=device) for n in running])


MIXTURE_CHUNK = 1 << 24
"""Marginal attention: the most word logits (rows x regions x V) one piece of the mixture computes at once; in
training each piece but the last is recomputed in the backward pass instead of kept, so memory stays bounded by it."""


class ImageNorm(nn.Module):
    """Regions ``(B, L, D)`` divided by the root mean square of their image's whole map, times a gain and plus a bias
    per feature (D,): one scale per image, where LayerNorm gives each region its own."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        wide = widened(features)
        scale = torch.rsqrt(wide.pow(2).mean(dim=(1, 2), keepdim=True) + self.eps)
        return (wide * scale).to(features.dtype) * self.weight + self.bias


class LSTMDecoder(nn.Module):
    """The paper's LSTM decoder (its gating, initial state and deep output) with soft, hard, marginal or variational
    attention (``attention_mode``)."""

    fixed_state = ("regions", "keys")   # decode state that depends on the image alone (never reordered)

    def __init__(self, config: LSTMDecoderConfig):
        super().__init__()
        self.config = c = config
        c.check()
        position_dim = c.position_dim if c.region_position == "sinusoidal" else 0
        if position_dim:
            self.register_buffer("position_code", grid_code(tuple(c.grid), position_dim), persistent=False)
        norms = {"layer": nn.LayerNorm, "image": ImageNorm}
        self.region_norm = norms[c.region_norm](c.region_dim) if c.region_norm in norms else None
        self.region_embed = None
        if c.region_embed:
            self.region_embed = nn.Sequential(nn.Linear(c.region_dim, c.region_embed), nn.ReLU())
        self.context_dim = d = (c.region_embed or c.region_dim) + position_dim
        self.embedding = nn.Embedding(c.vocab_size, c.embed_dim)
        self.attention = RegionAttention(c.attention, d, c.hidden_dim, c.attention_dim, c.learned_sharpness,
                                         c.score_activation)
        self.init_h = nn.Linear(d, c.hidden_dim)
        self.init_c = nn.Linear(d, c.hidden_dim)
        self.gate = None if c.gate == "none" else nn.Linear(c.hidden_dim, 1 if c.gate == "scalar" else d)
        self.input_gates = nn.Linear(c.embed_dim, 4 * c.hidden_dim)             # E y_{t-1} part, all steps at once
        self.recurrent_gates = nn.Linear(d + c.hidden_dim, 4 * c.hidden_dim, bias=False)  # [z_t; h_{t-1}] part
        self.out_hidden = nn.Linear(c.hidden_dim, c.embed_dim)                  # L_h
        self.out_context = nn.Linear(d, c.embed_dim, bias=False)               # L_z
        self.dropout = nn.Dropout(c.dropout)
        self.word_dropout = nn.Dropout(c.word_dropout) if c.word_dropout else None
        self.region_dropout = nn.Dropout(c.region_dropout) if c.region_dropout else None
        self.out_words = nn.Linear(c.embed_dim, c.vocab_size)                   # L_o
        if self.variational:        # q(s_t | a, h_{t-1}, y): the caption read both ways, scored as alpha is
            self.caption_reader = nn.LSTM(c.embed_dim, c.posterior_dim, batch_first=True, bidirectional=True)
            self.posterior = RegionAttention(c.attention, d, c.hidden_dim + 2 * c.posterior_dim, c.attention_dim,
                                             c.learned_sharpness, c.score_activation)

    @property
    def samples_locations(self) -> bool:
        """Stochastic hard attention (see :mod:`captioner.models.decoder`)."""
        return self.config.samples_locations

    @property
    def variational(self) -> bool:
        """Variational attention: trained by :class:`~captioner.objectives.losses.VariationalAttentionLoss`."""
        return self.config.attention_mode == "variational"

    # -- pieces shared by teacher forcing and step-by-step decoding ---------------------------------
    def prepare_regions(self, features: torch.Tensor) -> torch.Tensor:
        """Encoder features ``(B, L, D)`` -> regions ``(B, L, D')``: normalised per region or per image if set (CNN
        features such as VGG's conv5_4 are sparse and of norms in the hundreds, which saturates the additive score's
        tanh and the initial state's), mapped by the learned region embedding if set, with region dropout in training
        and the position code appended if set."""
        if self.region_norm is not None:
            features = self.region_norm(features)
        if self.region_embed is not None:
            features = self.region_embed(features)
        if self.region_dropout is not None:
            features = self.region_dropout(features)
        if self.config.region_position == "sinusoidal":
            code = self.position_code.to(features.dtype).expand(features.shape[0], -1, -1)
            features = torch.cat([features, code], dim=-1)
        return features

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Word embeddings ``E y`` (..., E) of ``tokens`` (...), with word dropout if set."""
        embedded = self.embedding(tokens)
        return embedded if self.word_dropout is None else self.word_dropout(embedded)

    def initial_hidden(self, regions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``h_0, c_0`` (B, H): ``f_init,h`` and ``f_init,c`` of the mean region (§3.1.2)."""
        mean = regions.mean(dim=1)
        return torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean))

    def context(self, regions: torch.Tensor, keys: torch.Tensor | None, h: torch.Tensor,
                expectation_rows: torch.Tensor | None = None, query: torch.Tensor | None = None,
                gate_logit: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Gated context ``z_t`` (N, D'), ``alpha_t`` (N, L) and the location terms, for hidden states ``h`` (N, H),
        N = B * k, over ``regions`` (B, L, D') and ``keys`` (B, L, A). ``query`` and ``gate_logit``: ``W_q h``
        and ``f_beta(h)``, if at hand.

        Soft and marginal: ``z_t = beta * sum_i alpha_ti a_i`` (marginal: with ``gate``, beta (N, 1 | D'), among
        the terms, which the mixture reads, with ``marginal_regions`` k < L ``top`` (N, k) the k regions of highest
        alpha, and with ``marginal_rest: soft`` ``rest`` (N, D'), the sum over the regions outside them).
        Variational, in training: ``log_alpha`` (N, L) among the terms. Hard: ``z_t = beta * a_{s_t}``, ``s_t``
        sampled (training, ``hard_decode=sample``) or the argmax, with terms ``chosen`` (N, L), ``log_prob_location``,
        ``entropy`` (N,); ``expectation_rows`` (N,) or ``hard_decode=expectation`` use ``alpha_t`` instead.
        """
        location_info: dict[str, torch.Tensor] = {}
        sampling = self.samples_locations and (self.training or self.config.hard_decode != "expectation")
        if sampling or (self.variational and self.training):    # terms that take alpha's log: from its scores
            log_alpha = self.attention.log_weights(keys, h, regions.shape[1], projected_query=query)   # eq. 4, 5
            wide_alpha = log_alpha.exp()                                # float32 or wider
            alpha = wide_alpha.to(h.dtype)
        else:
            alpha = self.attention(keys, h, regions.shape[1], projected_query=query)  # eq. 4, 5
        weights = alpha                                                 # soft: E[z_t] = sum_i alpha_ti a_i, eq. 13
        if self.variational and self.training:
            location_info["log_alpha"] = log_alpha                      # the prior of the posterior's KL
        if sampling:
            if self.training or self.config.hard_decode == "sample":
                # s_t ~ Multinoulli(alpha_t), eq. 8
                location = torch.multinomial(wide_alpha.detach(), 1).squeeze(1)
            else:
                location = log_alpha.argmax(dim=-1)
            chosen = F.one_hot(location, alpha.shape[1]).to(alpha.dtype)
            location_info = {"chosen": chosen, "log_prob_location": log_alpha.gather(1, location[:, None]).squeeze(1),
                             "entropy": -(wide_alpha * log_alpha).sum(dim=-1)}
            weights = chosen if expectation_rows is None else torch.where(expectation_rows[:, None], alpha, chosen)
        images = regions.shape[0]
        # z_t = phi({a_i}, {alpha_ti}) (eq. 6): sum_i w_i a_i with w = alpha (eq. 13) or one-hot s_t (eq. 9)
        z = torch.bmm(weights.view(images, -1, weights.shape[1]), regions).view(weights.shape[0], -1)
        if self.config.attention_mode == "marginal" and 0 < self.config.marginal_regions < alpha.shape[1]:
            # the mixture's components: the k regions of highest alpha (ranked in float32 or wider, not half)
            wide = widened(alpha)
            location_info["top"] = wide.topk(self.config.marginal_regions, dim=1).indices
        if "top" in location_info and self.soft_rest:
            # the mixture's last component: sum_i alpha_ti a_i over all but the top k, summed as it is in float32
            # or wider (z less the top k would carry z's half-precision rounding, which the rest's small mass then
            # divides, past float16's range), one step's rows at a time
            others = wide.scatter(1, location_info["top"], 0.0)
            with torch.autocast(regions.device.type, enabled=False):   # autocast would take bmm to half
                location_info["rest"] = torch.bmm(others.view(images, -1, others.shape[1]),
                                                  widened(regions).to(others.dtype)).view(others.shape[0], -1)
        if self.gate is not None:   # beta_t = sigmoid(f_beta(h_{t-1})) (§4.2.1)
            beta = torch.sigmoid(self.gate(h) if gate_logit is None else gate_logit)
            z = beta * z
            if self.config.attention_mode in ("marginal", "variational"):
                location_info["gate"] = beta
        return z, alpha, location_info

    @staticmethod
    def lstm_pointwise(gates: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``h_t, c_t`` from the gates' pre-activations ``i, f, g, o`` (N, 4H) and ``c_{t-1}`` (eq. 1-3)."""
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)     # c_t = f * c_{t-1} + i * g, eq. 2
        return torch.sigmoid(o) * torch.tanh(c), c                        # h_t = o * tanh(c_t), eq. 3

    def deep_output(self, embedded: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``tanh(E y_{t-1} + L_h h_t + L_z z_t)`` (eq. 7's argument of ``L_o``, with a tanh):
        ``(..., E), (..., H), (..., D')`` -> ``(..., E)``."""
        return torch.tanh(embedded + self.out_hidden(h) + self.out_context(z))

    def output_logits(self, embedded: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Deep output layer (eq. 7): ``(..., E), (..., H), (..., D')`` -> logits ``(..., V)``."""
        return self.out_words(self.dropout(self.deep_output(embedded, h, z)))

    @property
    def soft_rest(self) -> bool:
        """Marginal attention over the top-k regions with the others' soft context as one more component."""
        return self.config.attention_mode == "marginal" and self.config.marginal_rest == "soft"

    def mixture_log_probs(self, embedded: torch.Tensor, h: torch.Tensor, regions: torch.Tensor,
                          images: torch.Tensor, alpha: torch.Tensor, terms: dict[str, torch.Tensor]) -> torch.Tensor:
        """Marginal attention's word distribution: ``log sum_i alpha_ti softmax(L_o tanh(E y_{t-1} + L_h h_t +
        L_z beta_t a_i))`` (N, V) float32 or wider, for rows with ``embedded`` (N, E), ``h`` (N, H), ``alpha`` (N, L)
        and :meth:`context`'s ``terms`` of them: ``gate`` beta (N, 1 | D') where there is one, ``top`` (N, k) where
        the mixture is over the top k regions and, with ``marginal_rest: soft``, ``rest`` (N, D') the ungated
        ``sum_i alpha_ti a_i`` over the others; reading ``regions[images]`` from ``regions`` (B, L, D') and
        ``images`` (N,). One dropout mask per row, shared by its regions; computed :data:`MIXTURE_CHUNK` logits at a
        time (in one piece where torch.compile or torch.export traces it: a loop over a dynamic number of rows cannot
        be traced)."""
        base = embedded + self.out_hidden(h)                                   # (N, E): what the regions share
        keep = self.dropout(torch.ones_like(base))
        gate, top, rest = (terms.get(name) for name in ("gate", "top", "rest"))
        if torch.compiler.is_compiling():
            return self._mixture(regions, base, keep, images, alpha, gate, top, rest)
        regions_per_row = alpha.shape[1] if top is None else top.shape[1] + int(rest is not None)
        rows = max(1, MIXTURE_CHUNK // (regions_per_row * self.config.vocab_size))
        pieces = []
        for start in range(0, base.shape[0], rows):
            piece = [t[start:start + rows] for t in (base, keep, images, alpha)]
            piece += [None if t is None else t[start:start + rows] for t in (gate, top, rest)]
            # all but the last piece are recomputed in the backward pass, which reaches the last one first: memory
            # stays bounded by about one piece, and a batch that fits one piece runs it once
            if torch.is_grad_enabled() and start + rows < base.shape[0]:
                pieces.append(checkpoint(self._mixture, regions, *piece, use_reentrant=False,
                                         preserve_rng_state=False))     # nothing random inside
            else:
                pieces.append(self._mixture(regions, *piece))
        return torch.cat(pieces)

    def _mixture(self, regions, base, keep, images, alpha, gate, top, rest) -> torch.Tensor:
        """One piece of :meth:`mixture_log_probs`."""
        alpha = widened(alpha)               # the top k's weights and their renormalisation in float32 or wider
        if top is not None:                  # the k regions of highest alpha
            weights, chosen = alpha.gather(1, top), regions[images.unsqueeze(1), top]      # (n, k), (n, k, D')
        else:
            weights, chosen = alpha, regions.index_select(0, images)           # (n, L, D')
        if gate is not None:
            chosen = gate.unsqueeze(1) * chosen                                # beta a_i
        if rest is not None:           # + the others' soft context, at the rest of alpha's mass
            mass = alpha.scatter(1, top, 0.0).sum(dim=1, keepdim=True)         # (n, 1)
            context = rest / mass.clamp_min(1e-12)                             # sum_rest alpha_i a_i / mass
            if gate is not None:
                context = gate * context                                       # beta, as the others'
            weights = torch.cat([weights, mass], dim=1)
            chosen = torch.cat([chosen, context.to(chosen.dtype).unsqueeze(1)], dim=1)
        elif top is not None:                                                 # alpha renormalised over them
            weights = weights / weights.sum(dim=1, keepdim=True)
        deep = torch.tanh(base.unsqueeze(1) + self.out_context(chosen)) * keep.unsqueeze(1)   # (n, k, E)
        log_p = torch.log_softmax(widened(self.out_words(deep)), dim=-1)      # (n, k, V): log p(y | a_i)
        return torch.logsumexp(log_p + widened(weights).clamp_min(1e-30).log().unsqueeze(-1), dim=1)

    # -- teacher forcing ------------------------------------------------------------------------------
    def hidden_maps(self) -> list[nn.Module]:
        """The maps of ``h_{t-1}`` beside the gates' recurrent part: the attention's query, the gate (if any)."""
        return [m for m in (self.attention.query_projection, self.gate) if m is not None]

    def forward(self, features: torch.Tensor, captions: torch.Tensor) -> TeacherForced:
        """Teacher-forced pass (see :class:`~captioner.models.decoder.TeacherForced`): ``features`` (B, L, D),
        ``captions`` (B, T+1) with trailing ``<pad>``.

        Each caption runs for its own words only: the recurrence visits the captions longest first and
        step t advances just those still running (a shrinking prefix), so padding costs no recurrent
        work, and the output layer runs at the real positions only. At padding steps ``alpha`` and the location
        terms are zero.
        """
        sampling = self.samples_locations and self.training
        repeats = expectation_rows = running_expectation = None
        if sampling:
            features, captions, repeats, expectation_rows = self.location_copies(features, captions)
        batch, num_steps = captions.shape[0], captions.shape[1] - 1
        real = captions[:, 1:] != PAD_INDEX                      # (B, T) the words to predict
        lengths = real.sum(dim=1)                                             # (B,) real steps
        order = lengths.argsort(descending=True, stable=True)
        inverse = order.argsort()
        steps = torch.arange(num_steps, device=captions.device)
        runs = lengths.index_select(0, order)[None, :] > steps[:, None]      # (T, B): step t advances sorted row i
        running = [n for n in runs.sum(dim=1).tolist() if n > 0]              # rows at step t
        words = sum(running)
        # the words packed step by step (step t's running rows, then step t+1's): packed row of each position
        position = torch.full((num_steps, batch), words, dtype=torch.long, device=captions.device)
        position[runs] = torch.arange(words, device=captions.device)
        to_packed = position.t().index_select(0, inverse)                    # (B, T), callers' order; W at padding
        regions = self.prepare_regions(features.index_select(0, order))
        keys = self.attention.project_regions(regions)
        embedded = self.embed(captions[:, :-1].index_select(0, order).t()[runs])            # (W, E), packed
        h, c = self.initial_hidden(regions)
        if sampling:
            running_expectation = expectation_rows.index_select(0, order)
        query, gate = self.attention.query_projection, self.gate
        input_gates, query_weight = self.input_gates(embedded), None if query is None else query.weight
        gate_bias, gate_weight = (None, None) if gate is None else (gate.bias, gate.weight)
        # the packed pre-activations; with a record, the weights' gradients come from it in one product
        carrier, record = recurrent_terms(input_gates, gate_bias, self.recurrent_gates.weight, query_weight,
                                          gate_weight)
        hidden_weight, context_weight = self.step_weights(carrier, detach=record is not None)
        hs, zs, alphas, infos = self.recurrence(regions, keys, h, c, carrier.split(running), hidden_weight,
                                                context_weight, running, running_expectation, record)
        logits, keep = self.word_logits(embedded, hs, zs, alphas, infos, regions, running, to_packed[real])
        out = TeacherForced(logits=logits, alpha=_unpack(torch.cat(alphas), to_packed), repeats=repeats)
        if keep is not None:                                                  # variational attention, in training
            targets = self.embedding(captions[:, 1:].index_select(0, order))           # (B, T, E): y_1 .. y_T
            drawn = self.posterior_draws(regions, targets, lengths.index_select(0, order), running, h, hs, infos,
                                         embedded, keep)
            out.sampled_logits = drawn["logits"].index_select(0, to_packed[real])
            out.log_prob_location, out.kl, out.locations = (_unpack(drawn[k], to_packed)
                                                             for k in ("log_prob", "kl", "locations"))
        if sampling:
            out.log_prob_location = _unpack(torch.cat([i["log_prob_location"] for i in infos]), to_packed)
            out.entropy = _unpack(torch.cat([i["entropy"] for i in infos]), to_packed)
            out.expectation_rows = expectation_rows
        return out

    def word_logits(self, embedded, hs, zs, alphas, infos, regions, running: list[int],
                    targets_order: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits (W, V) of the W real words in the targets' order (``targets_order`` (W,): the packed row of
        each) from the packed steps' ``embedded`` words and their ``hs``, ``zs``, ``alphas`` (marginal attention: the
        mixture's log-probabilities); and, in variational training, the packed words' dropout mask (W, E), which
        the drawn words share (their difference from the soft words is a reward), else None."""
        if self.config.attention_mode == "marginal":
            images = packed_rows(running, embedded.device)
            terms = {name: torch.cat([i[name] for i in infos]) for name in ("gate", "top", "rest") if name in infos[0]}
            logits = self.mixture_log_probs(embedded, torch.cat(hs), regions, images, torch.cat(alphas), terms)
            return logits.index_select(0, targets_order), None
        deep = self.deep_output(embedded, torch.cat(hs), torch.cat(zs))              # (W, E), packed
        if not (self.variational and self.training):
            return self.out_words(self.dropout(deep.index_select(0, targets_order))), None
        keep = self.dropout(torch.ones_like(deep))
        return self.out_words((deep * keep).index_select(0, targets_order)), keep

    def posterior_draws(self, regions, targets, lengths, running: list[int], h0, hs, infos, embedded,
                        keep) -> dict:
        """Variational attention in training, over rows sorted longest first (as :meth:`forward` runs them): the
        posterior ``q_t`` (n, L) of each step from ``h_{t-1}`` and the caption reader's output at word t (``targets``
        (B, T, E) the embedded words to predict, ``lengths`` (B,)), one region ``s_t ~ q_t`` per word, and, packed
        (W, ...): the word ``logits`` (W, V) of the deep output layer at ``beta_t a_{s_t}``, ``log_prob`` log q(s_t),
        ``kl`` KL(q_t || alpha_t) over the L regions (log alpha_t from the steps' ``infos``), and the ``locations``
        s_t; ``keep`` (W, E) the soft words' dropout mask, which the drawn words share."""
        reading = nn.utils.rnn.pack_padded_sequence(targets, lengths.cpu(), batch_first=True)
        reading = nn.utils.rnn.pad_packed_sequence(self.caption_reader(reading)[0], batch_first=True)[0]  # (B, T, 2U)
        keys = self.posterior.project_regions(regions)
        posteriors = []
        for t, n in enumerate(running):
            h_prev = (h0 if t == 0 else hs[t - 1])[:n]
            query = torch.cat([h_prev, reading[:n, t].to(h_prev.dtype)], dim=1)
            posteriors.append(self.posterior.log_weights(None if keys is None else keys[:n], query, regions.shape[1]))
        log_q, log_alpha = torch.cat(posteriors), torch.cat([i["log_alpha"] for i in infos])  # (W, L), float32+
        q = log_q.exp()
        kl = (q * (log_q - log_alpha)).sum(dim=1)                                          # exact, over the L regions
        locations = torch.multinomial(q.detach(), 1).squeeze(1)                            # s_t ~ q_t
        images = packed_rows(running, regions.device)
        chosen = regions[images, locations]                                                 # (W, D'): a_{s_t}
        if self.gate is not None:
            chosen = torch.cat([i["gate"] for i in infos]) * chosen
        logits = self.out_words(self.deep_output(embedded, torch.cat(hs), chosen) * keep)
        return {"logits": logits, "log_prob": log_q.gather(1, locations[:, None]).squeeze(1), "kl": kl,
                "locations": locations}

    def location_copies(self, features: torch.Tensor, captions: torch.Tensor):
        """Hard-attention training rows (§4.1): each caption goes on the expectation (``alpha`` itself) with
        probability ``expectation_probability`` (drawn per caption, or once for all of them: ``expectation_draw``),
        once; else it is repeated for ``location_samples`` draws of its locations. Returns the rows' ``features``
        (B', L, D) and ``captions`` (B', T+1), ``repeats`` (B,) the rows of each caption (adjacent), and
        ``expectation_rows`` (B',) bool."""
        draws = captions.shape[0] if self.config.expectation_draw == "caption" else 1
        on_expectation = torch.rand(draws, device=captions.device) < self.config.expectation_probability
        on_expectation = on_expectation.expand(captions.shape[0])
        repeats = torch.where(on_expectation, 1, self.config.location_samples)
        if self.config.location_samples > 1:
            features, captions = features.repeat_interleave(repeats, 0), captions.repeat_interleave(repeats, 0)
        return features, captions, repeats, on_expectation.repeat_interleave(repeats)

    def step_weights(self, like: torch.Tensor, detach: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights a teacher-forced step multiplies by, transposed, cast once to the autocast type if one is
        on: ``[W_h; W_q; W_beta]^T`` (H, 4H [+ A] [+ G]), the maps of ``h_{t-1}`` in one matrix, and ``W_z^T``
        (D', 4H). ``detach`` when their gradients come from the record of
        :func:`captioner.kernels.recurrence.recurrent_terms`."""
        def maybe_detached(w: torch.Tensor) -> torch.Tensor:
            return w.detach() if detach else w

        weight = maybe_detached(self.recurrent_gates.weight)
        d = self.context_dim
        hidden = torch.cat([weight[:, d:]] + [maybe_detached(m.weight) for m in self.hidden_maps()]).t()
        context = weight[:, :d].contiguous().t()          # a contiguous copy: small products run faster than strided
        device = like.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            hidden, context = hidden.to(dtype), context.to(dtype)
        return hidden, context

    def recurrence(self, regions, keys, h, c, carriers, hidden_weight, context_weight, running: list[int],
                   expectation_rows, record: StepRecord | None = None):
        """The teacher-forced LSTM steps over rows sorted longest first: step t advances the first
        ``running[t]`` rows from its slice of the packed pre-activations ``carriers[t]``. Returns per step
        ``h_t``, ``z_t``, ``alpha_t`` and the location terms; leaves ``h_{t-1}`` and ``z_t`` in ``record``."""
        hs, zs, alphas, infos = [], [], [], []
        step_regions, step_keys = prefixes(regions, running), prefixes(keys, running)
        for t, n in enumerate(running):
            h_prev = h[:n]
            h, c, z, alpha, info = self.recurrent_step(step_regions[t], step_keys[t], h_prev, c[:n], carriers[t],
                                                       hidden_weight, context_weight,
                                                       None if expectation_rows is None else expectation_rows[:n])
            if record is not None:
                record.add(h_prev, z)
            hs.append(h)
            zs.append(z)
            alphas.append(alpha)
            infos.append(info)
        return hs, zs, alphas, infos

    def recurrent_step(self, regions, keys, h, c, carrier, hidden_weight, context_weight, expectation_rows=None):
        """One teacher-forced word for the running rows: the maps of ``h_{t-1}`` in one product onto the step's
        pre-activations ``carrier``, attention, gated context, the gates' context part and the LSTM cell; the
        unit that ``train.compile`` compiles (:func:`captioner.models.captioner.compile_decoder`)."""
        terms = torch.addmm(carrier, h, hidden_weight)                 # (n, 4H [+ A] [+ G]): the maps of h_{t-1}
        sizes = [4 * self.config.hidden_dim] + [m.weight.shape[0] for m in self.hidden_maps()]
        gates, *rest = terms.split(sizes, dim=1)
        query = rest[0] if self.attention.query_projection is not None else None
        gate_logit = rest[-1] if self.gate is not None else None        # list or tuple: torch.compile gives either
        z, alpha, info = self.context(regions, keys, h, expectation_rows, query, gate_logit)
        h, c = self.lstm_pointwise(torch.addmm(gates, z, context_weight), c)   # eq. 1-3
        return h, c, z, alpha, info

    # -- the decode-step interface --------------------------------------------------------------------
    def init_state(self, features: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-image state for step-by-step decoding from features ``(B, L, D)``."""
        regions = self.prepare_regions(features)
        h, c = self.initial_hidden(regions)
        state = {"regions": regions, "h": h, "c": c}
        keys = self.attention.project_regions(regions)
        if keys is not None:
            state["keys"] = keys
        return state

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor]):
        """One word: ``tokens`` (N,) previous words -> ``log_probs`` (N, V), new state, and the word's
        attention ``{"alpha": (N, L)}`` plus ``"chosen"`` (N, L) one-hot for hard attention."""
        embedded = self.embed(tokens)
        z, alpha, location_info = self.context(state["regions"], state.get("keys"), state["h"])
        # one product over [z; h] here (a teacher-forced step splits it in two, to fuse the h part with the
        # query's and the gate's): for the few rows of a search, two products over column halves cost more
        gates = self.input_gates(embedded) + self.recurrent_gates(torch.cat([z, state["h"]], dim=1))
        h, c = self.lstm_pointwise(gates, state["c"])
        if self.config.attention_mode == "marginal":
            regions = state["regions"]
            images = torch.arange(tokens.shape[0], device=tokens.device) // (tokens.shape[0] // regions.shape[0])
            log_probs = self.mixture_log_probs(embedded, h, regions, images, alpha, location_info)
        else:
            log_probs = torch.log_softmax(widened(self.output_logits(embedded, h, z)), dim=-1)
        attention = {"alpha": alpha}
        if "chosen" in location_info:
            attention["chosen"] = location_info["chosen"]
        return log_probs, {**state, "h": h, "c": c}, attention
