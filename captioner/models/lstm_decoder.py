"""The Show, Attend and Tell LSTM decoder (Xu et al. 2015, §3.1.2, §4.1, §4.2, §4.2.1), soft or hard.

At step t, from the previous word ``y_{t-1}``, hidden state ``h_{t-1}`` and the image's regions ``a`` (L, D):

    alpha_t = softmax_i score(a_i, h_{t-1})                 (captioner.models.attention)
    z_t     = beta_t * sum_i alpha_ti a_i,  beta_t = sigmoid(f_beta(h_{t-1}))   (scalar or vector gate)
    i, f, o, g = W [E y_{t-1}; z_t; h_{t-1}] + b;  c_t = f*c_{t-1} + i*g;  h_t = o*tanh(c_t)
    p(y_t)  ∝ exp(L_o dropout(tanh(E y_{t-1} + L_h h_t + L_z z_t)))       (deep output layer)

Hard attention (§4.1) replaces the expectation by a sample: ``s_t ~ Multinoulli(alpha_t)`` and
``z_t = beta_t * a_{s_t}``; during training, with probability ``expectation_probability`` per caption
the sample is replaced by its expected value (``z_t`` as in soft attention), the paper's variance
reduction. At inference the location is the argmax of ``alpha_t`` (or a sample, ``hard_decode``).
The training objective for hard attention is in :func:`captioner.training.losses.hard_attention_loss`.

``h_0, c_0`` come from one-layer tanh MLPs of the mean region. Work that does not depend on the step
is taken out of the loop: the region projection ``W_a a_i`` (once per image), the embedding part of
the LSTM gates and the whole output layer (once per caption, over all steps at once).

The decoder keeps the contract of :mod:`captioner.models.decoder`; its ``fixed_state`` is ``regions`` and
``keys`` (the projected regions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from captioner.data.vocabulary import Vocabulary
from captioner.models.attention import RegionAttention
from captioner.models.decoder import TeacherForced
from captioner.models.positions import grid_code


@dataclass
class LSTMDecoderConfig:
    vocab_size: int
    region_dim: int                 # D, the encoder's feature size
    grid: tuple[int, int]           # (gh, gw), L = gh * gw
    attention: str = "additive"     # additive | dot | scaled_dot | general | none (context = mean of regions)
    score_activation: str = "tanh"  # additive score: w . f(W_a a + W_h h) with f = tanh (the paper) | relu
    attention_mode: str = "soft"    # soft | hard (stochastic hard attention trained with REINFORCE)
    attention_dim: int = 512        # A: size of the projected regions and query in the score
    embed_dim: int = 512            # word embedding size (and of the deep output layer)
    hidden_dim: int = 512           # LSTM state size
    dropout: float = 0.5            # before the output layer
    gate: str = "scalar"            # scalar | vector | none (the paper's beta gate)
    learned_sharpness: bool = False # a learned inverse temperature exp(s) on the attention scores
    region_norm: str = "none"       # none | layer: LayerNorm over each region's features before anything reads them
    region_position: str = "none"   # none | sinusoidal: a grid position code appended to each region
    position_dim: int = 32          # size of that code
    hard_decode: str = "argmax"     # hard attention: argmax | sample, the location chosen at inference
    expectation_probability: float = 0.5  # hard training: a caption uses alpha instead of a sample (paper: 0.5)
    location_samples: int = 1       # hard training: location samples drawn per caption


class _Prefixes(torch.autograd.Function):
    """``tensor[:n]`` for each n of the non-increasing ``sizes``, as one autograd node. Separate slices would
    each, in the backward pass, zero-fill a gradient of ``tensor``'s full size and add it to the others (T
    times B x L x A work for the projected regions); here each prefix's gradient is added in place into one."""

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
    """``[tensor[:n] for n in sizes]``; one autograd node when ``tensor`` needs a gradient (:class:`_Prefixes`)."""
    if tensor is None:
        return [None] * len(sizes)
    if tensor.requires_grad and torch.is_grad_enabled():
        return list(_Prefixes.apply(tensor, sizes))
    return [tensor[:n] for n in sizes]


class LSTMDecoder(nn.Module):
    """Soft-attention LSTM decoder with the paper's gating, initial state and deep output."""

    fixed_state = ("regions", "keys")   # decode state that depends on the image alone (never reordered)

    def __init__(self, config: LSTMDecoderConfig):
        super().__init__()
        self.config = c = config
        if c.gate not in ("scalar", "vector", "none"):
            raise ValueError(f"gate must be scalar, vector or none, not {c.gate!r}")
        if c.attention_mode not in ("soft", "hard"):
            raise ValueError(f"attention_mode must be soft or hard, not {c.attention_mode!r}")
        if c.attention_mode == "hard" and c.attention == "none":
            raise ValueError("hard attention needs an attention score (attention must not be none)")
        if c.region_norm not in ("none", "layer"):
            raise ValueError(f"region_norm must be none or layer, not {c.region_norm!r}")
        if c.region_position not in ("none", "sinusoidal"):
            raise ValueError(f"region_position must be none or sinusoidal, not {c.region_position!r}")
        position_dim = c.position_dim if c.region_position == "sinusoidal" else 0
        if position_dim:
            self.register_buffer("position_code", grid_code(tuple(c.grid), position_dim), persistent=False)
        self.region_norm = nn.LayerNorm(c.region_dim) if c.region_norm == "layer" else None
        self.context_dim = d = c.region_dim + position_dim
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
        self.out_words = nn.Linear(c.embed_dim, c.vocab_size)                   # L_o

    @property
    def hard(self) -> bool:
        return self.config.attention_mode == "hard"

    @property
    def objective(self) -> str:
        """The training loss that fits this decoder (see :mod:`captioner.models.decoder`)."""
        return "hard_attention" if self.hard else "likelihood"

    # -- pieces shared by teacher forcing and step-by-step decoding ---------------------------------
    def prepare_regions(self, features: torch.Tensor) -> torch.Tensor:
        """Encoder features ``(B, L, D)`` -> regions ``(B, L, D')``: normalised per region if set (CNN features
        such as VGG's conv5_4 are sparse and of norms in the hundreds, which saturates the additive score's tanh
        and the initial state's), with the position code appended if set."""
        if self.region_norm is not None:
            features = self.region_norm(features)
        if self.config.region_position == "sinusoidal":
            code = self.position_code.to(features.dtype).expand(features.shape[0], -1, -1)
            features = torch.cat([features, code], dim=-1)
        return features

    def initial_hidden(self, regions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = regions.mean(dim=1)
        return torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean))

    def context(self, regions: torch.Tensor, keys: torch.Tensor | None, h: torch.Tensor,
                expectation_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Gated context ``z_t`` (N, D'), ``alpha_t`` (N, L) and, for hard attention, the chosen location, for
        N = B * k hidden states ``h`` (N, H) over B images' ``regions`` (B, L, D') and ``keys`` (B, L, A): each
        image's k hypotheses sit in adjacent rows (k = 1 in training).

        Soft: ``z_t = beta * sum_i alpha_ti a_i``. Hard: ``z_t = beta * a_{s_t}`` with ``s_t`` sampled from
        ``alpha_t`` (training, or ``hard_decode=sample``) or its argmax; rows where ``expectation_rows`` (B,)
        is true use ``alpha_t`` instead. The third value holds, for hard attention, ``chosen`` (B, L)
        one-hot, ``log_prob_location`` (B,) ``log alpha_t[s_t]`` and ``entropy`` (B,) of ``alpha_t``.
        """
        alpha = self.attention(keys, h, regions.shape[1])
        location_info: dict[str, torch.Tensor] = {}
        weights = alpha
        if self.hard:
            if self.training or self.config.hard_decode == "sample":
                location = torch.multinomial(alpha.detach().float(), 1).squeeze(1)
            else:
                location = alpha.argmax(dim=-1)
            chosen = F.one_hot(location, alpha.shape[1]).to(alpha.dtype)
            log_alpha = torch.log(alpha.clamp_min(1e-12))
            location_info = {"chosen": chosen, "log_prob_location": log_alpha.gather(1, location[:, None]).squeeze(1),
                             "entropy": -(alpha * log_alpha).sum(dim=-1)}
            weights = chosen if expectation_rows is None else torch.where(expectation_rows[:, None], alpha, chosen)
        images = regions.shape[0]
        z = torch.bmm(weights.view(images, -1, weights.shape[1]), regions).view(weights.shape[0], -1)
        if self.gate is not None:
            z = torch.sigmoid(self.gate(h)) * z
        return z, alpha, location_info

    def lstm_cell(self, input_gates: torch.Tensor, z: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        gates = input_gates + self.recurrent_gates(torch.cat([z, h], dim=1))
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def output_logits(self, embedded: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Deep output layer: ``(..., E), (..., H), (..., D')`` -> logits ``(..., V)``."""
        return self.out_words(self.dropout(torch.tanh(embedded + self.out_hidden(h) + self.out_context(z))))

    # -- teacher forcing ------------------------------------------------------------------------------
    def forward(self, features: torch.Tensor, captions: torch.Tensor) -> TeacherForced:
        """Teacher-forced pass (see :class:`~captioner.models.decoder.TeacherForced`): ``features`` (B, L, D),
        ``captions`` (B, T+1) with trailing ``<pad>``.

        Each caption runs for its own words only: the recurrence visits the captions longest first and
        step t advances just those still running (a shrinking prefix), so padding costs no recurrent
        work, and the output layer runs at the real positions only. At padding steps ``alpha`` and the location
        terms are zero.
        """
        sampling = self.hard and self.training
        repeats = self.config.location_samples if sampling else 1
        if repeats > 1:
            features, captions = features.repeat_interleave(repeats, 0), captions.repeat_interleave(repeats, 0)
        batch, num_steps = captions.shape[0], captions.shape[1] - 1
        lengths = (captions[:, 1:] != Vocabulary.pad_index).sum(dim=1)       # (B,) real steps
        order = lengths.argsort(descending=True, stable=True)
        steps = torch.arange(num_steps, device=captions.device)
        running = (lengths.index_select(0, order)[None, :] > steps[:, None]).sum(dim=1).tolist()   # rows at step t
        regions = self.prepare_regions(features.index_select(0, order))
        keys = self.attention.project_regions(regions)
        embedded = self.embedding(captions[:, :-1])           # (B, T, E), callers' order
        input_gates = self.input_gates(embedded).index_select(0, order)     # (B, T, 4H), longest first
        h, c = self.initial_hidden(regions)
        expectation_rows = running_expectation = None
        if sampling:
            expectation_rows = torch.rand(batch, device=captions.device) < self.config.expectation_probability
            running_expectation = expectation_rows.index_select(0, order)
        hs, zs, alphas, infos = self.recurrence(regions, keys, h, c, input_gates, running, running_expectation)
        inverse = order.argsort()

        def in_callers_order(per_step: list[torch.Tensor]) -> torch.Tensor:
            """Step outputs ``(n_t, ...)`` -> ``(B, T, ...)`` in the callers' row order, zero where not running."""
            padded = [F.pad(v, [0, 0] * (v.dim() - 1) + [0, batch - v.shape[0]]) for v in per_step]
            stacked = torch.stack(padded, 1)
            if stacked.shape[1] < num_steps:
                stacked = F.pad(stacked, [0, 0] * (stacked.dim() - 2) + [0, num_steps - stacked.shape[1]])
            return stacked.index_select(0, inverse)

        real = captions[:, 1:] != Vocabulary.pad_index                 # the output layer at real positions only
        out = TeacherForced(logits=self.output_logits(embedded[real], in_callers_order(hs)[real], in_callers_order(zs)[real]),
                            alpha=in_callers_order(alphas), repeats=repeats)
        if sampling:
            out.log_prob_location = in_callers_order([i["log_prob_location"] for i in infos])
            out.entropy = in_callers_order([i["entropy"] for i in infos])
            out.expectation_rows = expectation_rows
        return out

    def recurrence(self, regions, keys, h, c, input_gates, running: list[int], expectation_rows):
        """The teacher-forced LSTM steps over rows sorted longest first: step t advances the first
        ``running[t]`` rows. Returns per step ``h_t``, ``z_t``, ``alpha_t`` and the location terms."""
        hs, zs, alphas, infos = [], [], [], []
        running = [n for n in running if n > 0]
        # unbind, not input_gates[:, t], and prefixes, not keys[:n]: the backward of T slices would zero-fill
        # and add T full-size gradients; these add each step's gradient into one buffer
        step_regions, step_keys = prefixes(regions, running), prefixes(keys, running)
        for t, (n, step_gates) in enumerate(zip(running, input_gates.unbind(1))):
            h, c, z, alpha, info = self.recurrent_step(step_regions[t], step_keys[t], h[:n], c[:n], step_gates[:n],
                                                       None if expectation_rows is None else expectation_rows[:n])
            hs.append(h)
            zs.append(z)
            alphas.append(alpha)
            infos.append(info)
        return hs, zs, alphas, infos

    def recurrent_step(self, regions, keys, h, c, step_gates, expectation_rows=None):
        """One teacher-forced word: attention, gated context and the LSTM cell for the running rows; the unit
        that ``train.compile`` compiles (:func:`captioner.training.engine.compile_decoder`)."""
        z, alpha, info = self.context(regions, keys, h, expectation_rows)
        h, c = self.lstm_cell(step_gates, z, h, c)
        return h, c, z, alpha, info

    compile_targets = ("recurrent_step",)   # what train.compile compiles: the work repeated at every word

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
        embedded = self.embedding(tokens)
        z, alpha, location_info = self.context(state["regions"], state.get("keys"), state["h"])
        h, c = self.lstm_cell(self.input_gates(embedded), z, state["h"], state["c"])
        log_probs = torch.log_softmax(self.output_logits(embedded, h, z).float(), dim=-1)
        attention = {"alpha": alpha}
        if "chosen" in location_info:
            attention["chosen"] = location_info["chosen"]
        return log_probs, {**state, "h": h, "c": c}, attention
