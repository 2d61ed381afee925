"""A Transformer decoder over image regions, a drop-in alternative to the Show, Attend and Tell LSTM.

Pre-norm layers of

    x = x + Dropout(SelfAttention(LayerNorm(x)))           causal, <pad> keys hidden
    x = x + Dropout(CrossAttention(LayerNorm(x), memory))  memory: the projected regions
    x = x + Dropout(FFN(LayerNorm(x)))                     FFN = W_2 Dropout(ReLU(W_1 x))

and a final LayerNorm feed the output layer. Words get sinusoidal positions, regions
``memory = LayerNorm(W_r a) + P_region``. Teacher forcing runs position-wise parts on real positions only
(:class:`Packing`). ``alpha`` (rows sum to 1; zero at padding) is the cross-attention of layer
``attention_layer`` averaged over heads, or of every layer and head (``attention_map``).

Decoding state, batch first: with the cache (default), ``"cross_k{i}"``, ``"cross_v{i}"`` (B, heads, L, d_head)
and ``"self_k{i}"``, ``"self_v{i}"`` (B, heads, t, d_head), growing a position per word; with
``use_cache=False``, ``"memory"`` (B, L, d_model) and the words so far ``"tokens"`` (B, t). Both carry
``"position"`` (B,); ``fixed_state`` is ``"memory"`` and ``"cross_*"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from captioner.core.floats import widened
from captioner.core.settings import check_settings, setting
from captioner.data.tokens import PAD_INDEX
from captioner.models.decoder import TeacherForced
from captioner.models.positions import grid_code, sinusoidal_code


@dataclass
class TransformerDecoderConfig:
    """The ``model.transformer`` settings, and the sizes the data and the encoder give (filled when the model is
    built)."""

    vocab_size: int = 0                 # V, from the vocabulary
    region_dim: int = 0                 # D, the encoder's feature size
    grid: tuple[int, int] = (0, 0)      # (gh, gw), L = gh * gw
    d_model: int = setting(512, "width of every layer", minimum=1)
    num_layers: int = setting(3, "decoder layers", minimum=1)
    num_heads: int = setting(8, "attention heads per layer", minimum=1)
    ffn_dim: int = setting(2048, "feed-forward inner size", minimum=1)
    dropout: float = setting(0.1, "in every block", minimum=0, below=1)
    region_position: str = setting("learned", "learned | sinusoidal | none: position code added to the projected regions",
                                   choices=("learned", "sinusoidal", "none"))
    region_norm: str = setting("none", "layer: LayerNorm over each region's features before their projection (CNN "
                               "features such as VGG's are sparse, of norms in the hundreds) | none", choices=("none", "layer"))
    tie_embeddings: bool = setting(True, "the output layer's weight is the word embedding")
    attention_map: str = setting("layer", "what is reported as alpha: layer: the cross-attention of attention_layer, "
                                 "mean over heads | mean: the mean over every layer and head", choices=("layer", "mean"))
    attention_layer: int = setting(-1, "with attention_map: layer, the layer whose cross-attention is alpha")
    max_length: int = setting(64, "most word positions a caption or a decoding may use", minimum=1)
    memory: str = setting("regions", "what the cross-attention reads: regions (the L projected regions) | mean (their "
                          "mean alone, one token: the no-attention ablation)", choices=("regions", "mean"))

    def check(self) -> None:
        """Each setting's type, choices and bounds, then the settings that depend on one another (a ValueError
        names the one that does not fit)."""
        check_settings(self, "model.transformer")
        if self.d_model % 2:
            raise ValueError(f"d_model must be even (the words' sinusoidal positions), got {self.d_model}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of num_heads ({self.num_heads})")
        if not -self.num_layers <= self.attention_layer < self.num_layers:
            raise ValueError(f"attention_layer must name one of the {self.num_layers} layers, not {self.attention_layer}")
        if self.region_position == "sinusoidal" and self.d_model % 4:
            raise ValueError(f"d_model must be a multiple of 4 for a sinusoidal 2-D position code, got {self.d_model}")


class Packing:
    """The real positions of a ``(B, T)`` batch of words, and the way between their two layouts: packed rows
    ``(N, C)`` (the N real positions, row-major) and padded ``(B, T, C)`` (zeros at padding). Teacher forcing runs
    every position-wise part of a layer (projections, feed-forward, norms, dropout) on the packed rows only, and
    the attentions on the padded layout."""

    def __init__(self, real: torch.Tensor):
        self.real = real
        self.batch, self.steps = real.shape
        self.index = real.flatten().nonzero().squeeze(1)        # (N,)

    def pad(self, rows: torch.Tensor) -> torch.Tensor:
        """``(N, C)`` -> ``(B, T, C)``."""
        padded = rows.new_zeros(self.batch * self.steps, rows.shape[1]).index_copy(0, self.index, rows)
        return padded.view(self.batch, self.steps, -1)

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """``(B, T, C)`` -> ``(N, C)``."""
        return padded.reshape(self.batch * self.steps, -1).index_select(0, self.index)


def reported(weights: list[torch.Tensor]) -> torch.Tensor:
    """The reported layers' cross-attention, each ``(B, heads, T, L)``, as one: their mean (one layer: itself)."""
    return weights[0] if len(weights) == 1 else torch.stack(weights).mean(dim=0)


class DecoderLayer(nn.Module):
    """One pre-norm layer: masked self-attention, cross-attention over the regions, feed-forward."""

    def __init__(self, d_model: int, num_heads: int, ffn_dim: int, dropout: float):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.norm_self, self.norm_cross, self.norm_ffn = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.self_qkv = nn.Linear(d_model, 3 * d_model)
        self.self_out = nn.Linear(d_model, d_model)
        self.cross_q = nn.Linear(d_model, d_model)
        self.cross_kv = nn.Linear(d_model, 2 * d_model)
        self.cross_out = nn.Linear(d_model, d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn_dim), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn_dim, d_model))
        self.dropout = nn.Dropout(dropout)

    def split_heads(self, x: torch.Tensor, parts: int) -> torch.Tensor:
        """``(B, T, parts * d_model)`` -> ``(parts, B, heads, T, d_head)``."""
        b, t, _ = x.shape
        return x.view(b, t, parts, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)

    @staticmethod
    def merge_heads(x: torch.Tensor) -> torch.Tensor:
        """``(B, heads, T, d_head)`` -> ``(B, T, d_model)``."""
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b, t, h * d)

    def memory_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values, each ``(B, heads, L, d_head)``, of ``memory`` (B, L, d_model)."""
        keys, values = self.split_heads(self.cross_kv(memory), 2)
        return keys.contiguous(), values.contiguous()

    def cross_attention(self, q: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor], need_weights: bool
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Queries ``q`` (N, heads, T, d_head) of N = B * k hypotheses over B images' keys and values (B, heads, L,
        d_head) (image b's k hypotheses in adjacent rows) -> ``(attended (N, heads, T, d_head), weights)`` with
        ``weights`` (N, heads, T, L) when ``need_weights``."""
        keys, values = memory_kv
        rows, heads, steps, dim = q.shape
        images = keys.shape[0]
        grouped = q.view(images, rows // images, heads, steps, dim).transpose(1, 2).reshape(images, heads, -1, dim)
        weights = None
        if need_weights:
            weights = torch.softmax(grouped @ keys.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1)
            attended = weights @ values
            weights = weights.view(images, heads, rows // images, steps, -1).transpose(1, 2).reshape(rows, heads, steps, -1)
        else:
            attended = F.scaled_dot_product_attention(grouped, keys, values)
        return attended.view(images, heads, rows // images, steps, dim).transpose(1, 2).reshape(rows, heads, steps, dim), weights

    def forward(self, x: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor], self_mask: torch.Tensor | None = None,
                past_kv: tuple[torch.Tensor, torch.Tensor] | None = None, need_weights: bool = False,
                packing: Packing | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None]:
        """Positions ``x`` (B, T, d_model) -> ``(x, (keys, values), weights)``.

        ``memory_kv`` from :meth:`memory_kv`; ``self_mask`` (B, 1, T, t+T) bool, true where a word may attend
        (``None``: every key); ``past_kv`` the self-attention keys and values ``(B, heads, t, d_head)`` of t
        earlier positions, returned extended to t+T; ``weights`` (B, heads, T, L) when ``need_weights``. With
        ``packing``, ``x`` is its packed rows (N, d_model) and the self-attention is causal (``self_mask`` and
        ``past_kv`` unused): padding follows the words, so causality alone hides it.
        """
        pad, pack = (packing.pad, packing.pack) if packing is not None else (lambda t: t, lambda t: t)
        q, k, v = self.split_heads(pad(self.self_qkv(self.norm_self(x))), 3)
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], dim=2), torch.cat([past_kv[1], v], dim=2)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=self_mask, is_causal=packing is not None)
        x = x + self.dropout(self.self_out(pack(self.merge_heads(attended))))

        queries = self.split_heads(pad(self.cross_q(self.norm_cross(x))), 1)[0]
        attended, weights = self.cross_attention(queries, memory_kv, need_weights)
        x = x + self.dropout(self.cross_out(pack(self.merge_heads(attended))))
        x = x + self.dropout(self.ffn(self.norm_ffn(x)))
        return x, (k, v), weights


class TransformerDecoder(nn.Module):
    """Pre-norm Transformer decoder over image regions with a key/value cache for decoding."""

    samples_locations = False

    def __init__(self, config: TransformerDecoderConfig):
        super().__init__()
        self.config = c = config
        c.check()
        layer = c.attention_layer % c.num_layers
        self.reported_layers = range(c.num_layers) if c.attention_map == "mean" else range(layer, layer + 1)
        num_regions = c.grid[0] * c.grid[1]
        self.input_norm = nn.LayerNorm(c.region_dim) if c.region_norm == "layer" else None
        self.region_proj = nn.Linear(c.region_dim, c.d_model)
        self.region_norm = nn.LayerNorm(c.d_model)
        if c.region_position == "learned":
            self.region_position = nn.Parameter(torch.randn(num_regions, c.d_model) * 0.02)
        else:
            code = (grid_code(tuple(c.grid), c.d_model) if c.region_position == "sinusoidal"
                    else torch.zeros(num_regions, c.d_model))
            self.register_buffer("region_position", code, persistent=False)
        self.embedding = nn.Embedding(c.vocab_size, c.d_model)
        nn.init.normal_(self.embedding.weight, std=c.d_model ** -0.5)   # sqrt(d_model) * E y has unit scale
        self.register_buffer("word_position", sinusoidal_code(c.max_length, c.d_model), persistent=False)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(DecoderLayer(c.d_model, c.num_heads, c.ffn_dim, c.dropout) for _ in range(c.num_layers))
        self.final_norm = nn.LayerNorm(c.d_model)
        self.out_words = nn.Linear(c.d_model, c.vocab_size)
        if c.tie_embeddings:
            self.out_words.weight = self.embedding.weight

    # -- pieces shared by teacher forcing and step-by-step decoding ---------------------------------
    def prepare_regions(self, features: torch.Tensor) -> torch.Tensor:
        """Encoder features ``(B, L, D)`` -> memory ``(B, L, d_model)``: normalised per region if set, projected,
        normalised, positioned; with ``memory: mean``, their mean ``(B, 1, d_model)``, which every cross-attention
        then returns whole (no attention)."""
        if features.shape[1] != self.region_position.shape[0]:
            raise ValueError(f"expected {self.region_position.shape[0]} regions (grid {tuple(self.config.grid)}), "
                             f"got {features.shape[1]}")
        if self.input_norm is not None:
            features = self.input_norm(features)
        memory = self.dropout(self.region_norm(self.region_proj(features)) + self.region_position)
        return memory.mean(dim=1, keepdim=True) if self.config.memory == "mean" else memory

    def embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Words ``tokens`` (B, T) at ``positions`` (B, T) or (T,) -> inputs ``(B, T, d_model)``."""
        return self.dropout(self.embedding(tokens) * math.sqrt(self.config.d_model) + self.word_position[positions])

    def check_length(self, words: int) -> None:
        """Word positions exist up to ``max_length``: refuse to read or decode ``words`` beyond that."""
        if words > self.config.max_length:
            raise ValueError(f"{words} word positions exceed model.transformer.max_length={self.config.max_length}")

    def memory_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's cross-attention keys and values, each ``(B, heads, L, d_head)``."""
        return [layer.memory_kv(memory) for layer in self.layers]

    def run_layers(self, tokens: torch.Tensor, memory_kv: list[tuple[torch.Tensor, torch.Tensor]],
                   packing: Packing | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced pass of ``tokens`` (B, T) (``<pad>`` = 0) over ``memory_kv`` from :meth:`memory_kv`.

        Returns the final (normalised) states ``(B, T, d_model)`` and the per-head cross-attention
        ``(B, heads, T, L)`` of the reported layers. With ``packing`` (a prefix of each row, made outside so that a
        compiled ``run_layers`` sees no data-dependent size), the states are those positions' alone, packed
        ``(N, d_model)`` row-major, and the cross-attention is zero elsewhere.
        """
        steps = tokens.shape[1]
        self.check_length(steps)
        self_mask = None
        if packing is None:
            causal = torch.ones(steps, steps, dtype=torch.bool, device=tokens.device).tril()
            self_mask = (causal & (tokens != PAD_INDEX)[:, None, :])[:, None]   # (B, 1, T, T)
            x = self.embed(tokens, torch.arange(steps, device=tokens.device))
        else:
            x = self.embed(tokens.reshape(-1)[packing.index], packing.index % steps)   # (N, d_model)
        weights = []
        for i, (layer, layer_kv) in enumerate(zip(self.layers, memory_kv)):
            x, _, layer_weights = layer(x, layer_kv, self_mask, need_weights=i in self.reported_layers, packing=packing)
            if layer_weights is not None:
                weights.append(layer_weights)
        weights = reported(weights)
        return self.final_norm(x), weights if packing is None else weights * packing.real[:, None, :, None]

    # -- teacher forcing ------------------------------------------------------------------------------
    def forward(self, features: torch.Tensor, captions: torch.Tensor) -> TeacherForced:
        """Teacher-forced pass.

        ``features`` (B, L, D); ``captions`` (B, T+1) = ``<start> w_1 .. <end> <pad>..``. Returns ``logits``
        (W, V) at the W real positions of ``captions[:, 1:]`` and ``alpha`` (B, T, L), the reported cross-attention
        averaged over heads (zero at padding).
        """
        memory_kv = self.memory_kv(self.prepare_regions(features))
        packing = Packing(captions[:, 1:] != PAD_INDEX)     # the positions that predict a word
        states, weights = self.run_layers(captions[:, :-1], memory_kv, packing)
        if not self.attends:
            return TeacherForced(logits=self.out_words(states))
        return TeacherForced(logits=self.out_words(states), alpha=weights.mean(dim=1))

    @property
    def attends(self) -> bool:
        """Whether the cross-attention chooses among regions (``memory: regions``) and so has maps to report."""
        return self.config.memory == "regions"

    # -- the decode-step interface --------------------------------------------------------------------
    @property
    def fixed_state(self) -> tuple[str, ...]:
        """Names of the decode-state entries that depend on the image alone."""
        return ("memory", *(f"cross_{kv}{i}" for i in range(len(self.layers)) for kv in "kv"))

    def init_state(self, features: torch.Tensor, use_cache: bool = True) -> dict[str, torch.Tensor]:
        """Per-image state for step-by-step decoding from features ``(B, L, D)`` (see the module docstring)."""
        memory = self.prepare_regions(features)
        batch = features.shape[0]
        position = torch.zeros(batch, dtype=torch.long, device=features.device)
        if not use_cache:
            return {"memory": memory, "tokens": torch.empty(batch, 0, dtype=torch.long, device=features.device),
                    "position": position}
        state = {"position": position}
        for i, (keys, values) in enumerate(self.memory_kv(memory)):
            state[f"cross_k{i}"], state[f"cross_v{i}"] = keys, values
            state[f"self_k{i}"] = state[f"self_v{i}"] = keys.new_empty(batch, keys.shape[1], 0, keys.shape[3])
        return state

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """One word: ``tokens`` (N,) previous words -> ``log_probs`` (N, V) float32 or wider, new state, and the
        word's attention ``{"alpha": (N, L)}``."""
        position = state["position"]
        if "memory" in state:
            prefix = torch.cat([state["tokens"], tokens[:, None]], dim=1)
            states, weights = self.run_layers(prefix, self.memory_kv(state["memory"]))
            new_state = {**state, "tokens": prefix, "position": position + 1}
            log_probs = torch.log_softmax(widened(self.out_words(states[:, -1])), dim=-1)
            return log_probs, new_state, {"alpha": weights[:, :, -1].mean(dim=1)} if self.attends else {}
        self.check_length(state["self_k0"].shape[2] + 1)
        x = self.embed(tokens[:, None], position[:, None])
        new_state = {**state, "position": position + 1}
        weights = []
        for i, layer in enumerate(self.layers):
            x, (keys, values), layer_weights = layer(
                x, (state[f"cross_k{i}"], state[f"cross_v{i}"]), past_kv=(state[f"self_k{i}"], state[f"self_v{i}"]),
                need_weights=i in self.reported_layers)
            new_state[f"self_k{i}"], new_state[f"self_v{i}"] = keys, values
            if layer_weights is not None:
                weights.append(layer_weights)
        log_probs = torch.log_softmax(widened(self.out_words(self.final_norm(x[:, 0]))), dim=-1)
        return log_probs, new_state, {"alpha": reported(weights).mean(dim=1)[:, 0]} if self.attends else {}
