"""The Show, Attend and Tell LSTM decoder (Xu et al. 2015, §3.1.2, §4.1, §4.2, §4.2.1), soft or hard.

At step t, from the previous word ``y_{t-1}``, hidden state ``h_{t-1}`` and the image's regions ``a`` (L, D):

    alpha_t = softmax_i score(a_i, h_{t-1})                 (captioner.models.attention)
    z_t     = beta_t * sum_i alpha_ti a_i,  beta_t = sigmoid(f_beta(h_{t-1}))   (scalar or vector gate)
    i, f, o, g = W [E y_{t-1}; z_t; h_{t-1}] + b;  c_t = f*c_{t-1} + i*g;  h_t = o*tanh(c_t)
    p(y_t)  ∝ exp(L_o dropout(tanh(E y_{t-1} + L_h h_t + L_z z_t)))       (deep output layer)

Hard attention (§4.1) replaces the expectation by a sample: ``s_t ~ Multinoulli(alpha_t)`` and
``z_t = beta_t * a_{s_t}``; during training, with probability ``expectation_probability`` per caption
the sample is replaced by its expected value (``z_t`` as in soft attention), the paper's variance
reduction, and the other captions draw ``location_samples`` location sequences each. At inference (``hard_decode``) the location is the argmax of ``alpha_t``, a sample, or the expected
value itself (``expectation``: the context the expectation rows trained on, what the paper's code decodes with
when it draws no sample).
The training objective for hard attention is in :class:`captioner.training.losses.HardAttentionLoss`.

``h_0, c_0`` come from one-layer tanh MLPs of the mean region. Work that does not depend on the step
is taken out of the loop: the region projection ``W_a a_i`` (once per image), the embedding part of
the LSTM gates and the whole output layer (once per caption, over all steps at once).

Teacher forcing lays the words out packed, step-major (step t's running captions, longest first, then step
t+1's): per word, the three linear maps of ``h_{t-1}`` (the gates' recurrent part, the attention's query and
the gate ``f_beta``) are one matrix product, and the gradients of the weights that every step uses come in the
backward pass as one product over all words (:class:`_RecurrentTerms`) rather than one thin product and one
full-size accumulation per word.

The decoder keeps the contract of :mod:`captioner.models.decoder`; its ``fixed_state`` is ``regions`` and
``keys`` (the projected regions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from captioner.models.attention import ACTIVATIONS, SCORES, RegionAttention
from captioner.models.decoder import TeacherForced
from captioner.models.positions import grid_code
from captioner.settings import check_settings, setting
from captioner.tokens import PAD_INDEX


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
    attention_mode: str = setting("soft", "soft | hard (stochastic hard attention trained with REINFORCE)",
                                  choices=("soft", "hard"))
    attention_dim: int = setting(512, "A: size of the projected regions and query in the score", minimum=1)
    embed_dim: int = setting(512, "word embedding size (and of the deep output layer)", minimum=1)
    hidden_dim: int = setting(512, "LSTM state size", minimum=1)
    dropout: float = setting(0.5, "before the output layer", minimum=0, below=1)
    gate: str = setting("scalar", "scalar | vector | none (the paper's beta gate)", choices=("scalar", "vector", "none"))
    learned_sharpness: bool = setting(False, "a learned inverse temperature exp(s) on the attention scores")
    region_norm: str = setting("none", "none | layer: LayerNorm over each region's features before anything reads them",
                               choices=("none", "layer"))
    region_position: str = setting("none", "none | sinusoidal: a grid position code appended to each region",
                                   choices=("none", "sinusoidal"))
    position_dim: int = setting(32, "size of that code (a multiple of 4)", minimum=4)
    hard_decode: str = setting(
        "argmax", "hard attention at inference: argmax (one cell) | sample (a drawn cell) | expectation (alpha's "
        "mean of the regions, as the expectation rows of training)", choices=("argmax", "sample", "expectation"))
    expectation_probability: float = setting(
        0.5, "hard training: a caption uses alpha instead of a sample (paper: 0.5)", minimum=0, maximum=1)
    location_samples: int = setting(1, "hard training: location samples drawn per caption", minimum=1)

    def check(self) -> None:
        """Each setting's type, choices and bounds, then the settings that depend on one another (a ValueError
        names the one that does not fit)."""
        check_settings(self, "model.lstm")
        if self.attention_mode == "hard" and self.attention == "none":
            raise ValueError("hard attention needs an attention score (attention must not be none)")
        if self.region_position == "sinusoidal" and self.position_dim % 4:
            raise ValueError(f"position_dim must be a multiple of 4 for a 2-D position code, got {self.position_dim}")


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


class _StepRecord:
    """What the teacher-forced recurrence leaves for :class:`_RecurrentTerms`'s backward pass: each step's
    ``h_{t-1}`` and ``z_t`` of its running rows (detached), in the packed order."""

    def __init__(self):
        self.hidden: list[torch.Tensor] = []
        self.context: list[torch.Tensor] = []


class _RecurrentTerms(torch.autograd.Function):
    """The per-word pre-activations of the teacher-forced recurrence, ``carrier`` (W, 4H [+ A] [+ G]) for W packed
    words: the embedding part of the gates (``input_gates``), zeros for the attention's query ``W_q h_{t-1}`` and
    the gate's bias for ``f_beta(h_{t-1})``. Step t adds ``h_{t-1} [W_h; W_q; W_beta]^T`` and ``z_t W_z^T`` to its
    slice with the weights detached, so the gradient reaching ``carrier`` is, word by word, that of the gates, of
    the query and of the gate's logit; the backward pass here turns it into the weights' gradients with one
    product over all words, ``d[W_z W_h] = d gates^T [z | h_prev]`` (and the same for ``W_q``, ``W_beta``), from
    the inputs the recurrence left in ``record``. Per-word weight gradients would be T thin products and T
    accumulations of the full weight."""

    @staticmethod
    def carrier(input_gates, gate_bias, query_weight, gate_weight) -> torch.Tensor:
        """The pre-activations before the steps add theirs: ``[input_gates | 0 | gate_bias]`` (W, 4H [+ A] [+ G])."""
        parts = [input_gates]
        if query_weight is not None:
            parts.append(input_gates.new_zeros(input_gates.shape[0], query_weight.shape[0]))
        if gate_weight is not None:
            parts.append(gate_bias.to(input_gates.dtype).expand(input_gates.shape[0], -1))
        return torch.cat(parts, dim=1)

    @staticmethod
    def forward(ctx, input_gates, gate_bias, recurrent_weight, query_weight, gate_weight, record):
        ctx.record = record
        ctx.sizes = [input_gates.shape[1]] + [w.shape[0] for w in (query_weight, gate_weight) if w is not None]
        ctx.has_query, ctx.has_gate = query_weight is not None, gate_weight is not None
        return _RecurrentTerms.carrier(input_gates, gate_bias, query_weight, gate_weight)

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


def _unpack(packed: torch.Tensor, to_packed: torch.Tensor) -> torch.Tensor:
    """Packed rows ``(W, ...)`` -> ``(B, T, ...)`` by ``to_packed`` (B, T), the packed row of each position, W at
    padding (where the result is zero)."""
    padded = torch.cat([packed, packed.new_zeros(1, *packed.shape[1:])])
    return padded.index_select(0, to_packed.reshape(-1)).view(*to_packed.shape, *packed.shape[1:])


class LSTMDecoder(nn.Module):
    """Soft-attention LSTM decoder with the paper's gating, initial state and deep output."""

    fixed_state = ("regions", "keys")   # decode state that depends on the image alone (never reordered)

    def __init__(self, config: LSTMDecoderConfig):
        super().__init__()
        self.config = c = config
        c.check()
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
                expectation_rows: torch.Tensor | None = None, query: torch.Tensor | None = None,
                gate_logit: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Gated context ``z_t`` (N, D'), ``alpha_t`` (N, L) and, for hard attention, the chosen location, for
        N = B * k hidden states ``h`` (N, H) over B images' ``regions`` (B, L, D') and ``keys`` (B, L, A): each
        image's k hypotheses sit in adjacent rows (k = 1 in training). ``query`` (the attention's ``W_q h``) and
        ``gate_logit`` (``f_beta(h)``) are computed from ``h`` unless given.

        Soft: ``z_t = beta * sum_i alpha_ti a_i``. Hard: ``z_t = beta * a_{s_t}`` with ``s_t`` sampled from
        ``alpha_t`` (training, or ``hard_decode=sample``) or its argmax; rows where ``expectation_rows`` (B,)
        is true use ``alpha_t`` instead, and so does every row at inference with ``hard_decode=expectation``. The
        third value holds, where a location is chosen, ``chosen`` (B, L) one-hot, ``log_prob_location`` (B,)
        ``log alpha_t[s_t]`` and ``entropy`` (B,) of ``alpha_t``.
        """
        alpha = self.attention(keys, h, regions.shape[1], projected_query=query)
        location_info: dict[str, torch.Tensor] = {}
        weights = alpha
        if self.hard and (self.training or self.config.hard_decode != "expectation"):
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
            z = torch.sigmoid(self.gate(h) if gate_logit is None else gate_logit) * z
        return z, alpha, location_info

    @staticmethod
    def lstm_pointwise(gates: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``h_t, c_t`` from the gates' pre-activations ``i, f, g, o`` (N, 4H) and ``c_{t-1}``."""
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def deep_output(self, embedded: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``tanh(E y_{t-1} + L_h h_t + L_z z_t)``: ``(..., E), (..., H), (..., D')`` -> ``(..., E)``."""
        return torch.tanh(embedded + self.out_hidden(h) + self.out_context(z))

    def output_logits(self, embedded: torch.Tensor, h: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Deep output layer: ``(..., E), (..., H), (..., D')`` -> logits ``(..., V)``."""
        return self.out_words(self.dropout(self.deep_output(embedded, h, z)))

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
        sampling = self.hard and self.training
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
        embedded = self.embedding(captions[:, :-1].index_select(0, order).t()[runs])       # (W, E), packed
        h, c = self.initial_hidden(regions)
        if sampling:
            running_expectation = expectation_rows.index_select(0, order)
        # the one-product weight gradients read the steps' inputs from a record filled after this node's forward:
        # a side channel torch.compile cannot trace (it builds the backward graph first), so compiled code takes
        # plain autograd through each step's products instead (the same gradients, more work)
        record = _StepRecord() if torch.is_grad_enabled() and not torch.compiler.is_compiling() else None
        query, gate = self.attention.query_projection, self.gate
        input_gates, query_weight = self.input_gates(embedded), None if query is None else query.weight
        gate_bias, gate_weight = (None, None) if gate is None else (gate.bias, gate.weight)
        if record is not None:
            carrier = _RecurrentTerms.apply(input_gates, gate_bias, self.recurrent_gates.weight, query_weight,
                                            gate_weight, record)
        else:
            carrier = _RecurrentTerms.carrier(input_gates, gate_bias, query_weight, gate_weight)
        hidden_weight, context_weight = self.step_weights(carrier, detach=record is not None)
        hs, zs, alphas, infos = self.recurrence(regions, keys, h, c, carrier.split(running), hidden_weight,
                                                context_weight, running, running_expectation, record)
        deep = self.deep_output(embedded, torch.cat(hs), torch.cat(zs))              # (W, E), packed
        out = TeacherForced(logits=self.out_words(self.dropout(deep.index_select(0, to_packed[real]))),
                            alpha=_unpack(torch.cat(alphas), to_packed), repeats=repeats)
        if sampling:
            out.log_prob_location = _unpack(torch.cat([i["log_prob_location"] for i in infos]), to_packed)
            out.entropy = _unpack(torch.cat([i["entropy"] for i in infos]), to_packed)
            out.expectation_rows = expectation_rows
        return out

    def location_copies(self, features: torch.Tensor, captions: torch.Tensor):
        """Hard-attention training rows: each caption goes on the expectation (``alpha`` itself) with probability
        ``expectation_probability``, once; else it is repeated for ``location_samples`` draws of its locations.
        Returns the rows' ``features`` (B', L, D) and ``captions`` (B', T+1), ``repeats`` (B,) the rows of each
        caption (adjacent), and ``expectation_rows`` (B',) bool."""
        on_expectation = torch.rand(captions.shape[0], device=captions.device) < self.config.expectation_probability
        repeats = torch.where(on_expectation, 1, self.config.location_samples)
        if self.config.location_samples > 1:
            features, captions = features.repeat_interleave(repeats, 0), captions.repeat_interleave(repeats, 0)
        return features, captions, repeats, on_expectation.repeat_interleave(repeats)

    def step_weights(self, like: torch.Tensor, detach: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights a teacher-forced step multiplies by, transposed, cast once to the autocast type if one is
        on: ``[W_h; W_q; W_beta]^T`` (H, 4H [+ A] [+ G]), the maps of ``h_{t-1}`` in one matrix, and ``W_z^T``
        (D', 4H). ``detach`` when their gradients come from :class:`_RecurrentTerms`."""
        def maybe_detached(w: torch.Tensor) -> torch.Tensor:
            return w.detach() if detach else w

        weight = maybe_detached(self.recurrent_gates.weight)
        d = self.context_dim
        hidden = torch.cat([weight[:, d:]] + [maybe_detached(m.weight) for m in self.hidden_maps()]).t()
        context = weight[:, :d].contiguous().t()          # a contiguous copy: small products ~15 % faster than strided
        device = like.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            hidden, context = hidden.to(dtype), context.to(dtype)
        return hidden, context

    def recurrence(self, regions, keys, h, c, carriers, hidden_weight, context_weight, running: list[int],
                   expectation_rows, record: _StepRecord | None = None):
        """The teacher-forced LSTM steps over rows sorted longest first: step t advances the first
        ``running[t]`` rows from its slice of the packed pre-activations ``carriers[t]``. Returns per step
        ``h_t``, ``z_t``, ``alpha_t`` and the location terms; leaves ``h_{t-1}`` and ``z_t`` in ``record``."""
        hs, zs, alphas, infos = [], [], [], []
        # prefixes, not keys[:n]: the backward of T slices would zero-fill and add T full-size gradients;
        # this adds each step's gradient into one buffer
        step_regions, step_keys = prefixes(regions, running), prefixes(keys, running)
        for t, n in enumerate(running):
            h_prev = h[:n]
            h, c, z, alpha, info = self.recurrent_step(step_regions[t], step_keys[t], h_prev, c[:n], carriers[t],
                                                       hidden_weight, context_weight,
                                                       None if expectation_rows is None else expectation_rows[:n])
            if record is not None:
                record.hidden.append(h_prev.detach())
                record.context.append(z.detach())
            hs.append(h)
            zs.append(z)
            alphas.append(alpha)
            infos.append(info)
        return hs, zs, alphas, infos

    def recurrent_step(self, regions, keys, h, c, carrier, hidden_weight, context_weight, expectation_rows=None):
        """One teacher-forced word for the running rows: the maps of ``h_{t-1}`` in one product onto the step's
        pre-activations ``carrier``, attention, gated context, the gates' context part and the LSTM cell; the
        unit that ``train.compile`` compiles (:func:`captioner.training.engine.compile_decoder`)."""
        terms = torch.addmm(carrier, h, hidden_weight)                 # (n, 4H [+ A] [+ G])
        sizes = [4 * self.config.hidden_dim] + [m.weight.shape[0] for m in self.hidden_maps()]
        gates, *rest = terms.split(sizes, dim=1)
        query = rest[0] if self.attention.query_projection is not None else None
        gate_logit = rest[-1] if self.gate is not None else None        # list or tuple: torch.compile gives either
        z, alpha, info = self.context(regions, keys, h, expectation_rows, query, gate_logit)
        h, c = self.lstm_pointwise(torch.addmm(gates, z, context_weight), c)
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
        embedded = self.embedding(tokens)
        z, alpha, location_info = self.context(state["regions"], state.get("keys"), state["h"])
        # one product over [z; h] here (a teacher-forced step splits it in two, to fuse the h part with the
        # query's and the gate's): for the few rows of a search, two products over column halves cost more
        gates = self.input_gates(embedded) + self.recurrent_gates(torch.cat([z, state["h"]], dim=1))
        h, c = self.lstm_pointwise(gates, state["c"])
        log_probs = torch.log_softmax(self.output_logits(embedded, h, z).float(), dim=-1)
        attention = {"alpha": alpha}
        if "chosen" in location_info:
            attention["chosen"] = location_info["chosen"]
        return log_probs, {**state, "h": h, "c": c}, attention
