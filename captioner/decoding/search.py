"""Greedy decoding, sampling and batched beam search (plain, diverse, n-best): one implementation for
every decoder.

A decoder plugs in through the two-method decode-step interface of :mod:`captioner.models.decoder`
(``init_state``, ``step``) and names its ``fixed_state``: the state entries that depend on the image alone
(its regions and their projections). Those keep one row per image for the whole search: a search with k
hypotheses (beams or samples) per image repeats only the other entries k times, and the decoder broadcasts
its fixed state over each image's k adjacent rows. :func:`decode` runs the search the ``decode`` section of a
config asks for (:class:`DecodeConfig`); :class:`TokenRules` say which words may come at a step.

Searches return one :class:`Generation` per image; :func:`sample_captions` returns the raw tensors (with
their gradient, for self-critical training).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from captioner.core.floats import widened
from captioner.core.settings import check_settings, setting
from captioner.data.text import OPEN_WORDS
from captioner.errors import CaptionerError

if TYPE_CHECKING:
    from captioner.data.vocabulary import Vocabulary

NEG_INF = float("-inf")


@dataclass
class DecodeConfig:
    """The ``decode`` section of a config: how captions are generated."""

    method: str = setting("beam", "beam (beam = 1: greedy) | sample", choices=("beam", "sample"))
    beam: int = setting(3, "beam size for evaluate, caption, attend and reports (1 = greedy)", minimum=1)
    max_length: int = setting(20, "most words a generated caption may have", minimum=1)
    min_length: int = setting(0, "no <end> before this many words", minimum=0)
    length_penalty: float = setting(0.0, "score / length**alpha when choosing among finished beams", minimum=0)
    suppress_unk: bool = setting(True, "<unk> is never emitted (<pad> and <start> never are)")
    block_ngram: int = setting(0, "no n-gram of this size twice in one caption; 0 = off (the real-photo recipes: 2)", minimum=0)
    no_dangling_end: bool = setting(False, "no <end> right after a word an English caption cannot end on (a, the, of, "
                                    "with, ...: captioner.data.text.OPEN_WORDS)")
    seen_endings: bool = setting(False, "<end> only where the training captions end (the vocabulary's endings): "
                                 "after a word that ends some training caption and, right after an open word (a, "
                                 "on, the, ...), only after two words that end one (no \"on a dirt\")")
    beam_groups: int = setting(1, "diverse beam search: the beams split into this many groups", minimum=1)
    diversity: float = setting(0.5, "diverse beam search: penalty per earlier group that chose the same word at a step",
                               minimum=0)
    n_best: int = setting(1, "finished beams kept per image (Generation.beams), best first", minimum=1)
    logit_adjustment: float = setting(0.0, "tau: each word's log-probability less tau times the log of its share of "
                                      "the training words (Menon et al. 2021), renormalised: rarer words favoured; "
                                      "0 = off", minimum=0)
    temperature: float = setting(1.0, "sampling: softmax temperature", above=0)
    top_k: int = setting(0, "sampling: only the k most likely words; 0 = all", minimum=0)
    top_p: float = setting(1.0, "sampling: only the most likely words whose probabilities sum to p (nucleus)",
                           above=0, maximum=1)
    seed: int = setting(0, "sampling: with the image's identity, seeds its draws (same captions batched or not)",
                        minimum=0)
    compile: bool = setting(False, "torch.compile each decoding step (on CUDA as CUDA graphs: mode reduce-overhead)")

    @classmethod
    def of(cls, config, **changes) -> "DecodeConfig":
        """A resolved config's ``decode`` section, with ``changes`` (None values ignored)."""
        return dataclasses.replace(config.decode, **{k: v for k, v in changes.items() if v is not None})

    def same_as(self, saved: dict) -> bool:
        """Whether ``saved`` (a ``decode`` section as a scores file keeps it) is these settings, a setting it lacks
        (saved before the setting existed) at its default."""
        defaults = dataclasses.asdict(DecodeConfig())
        return all(saved.get(key, defaults[key]) == value for key, value in dataclasses.asdict(self).items())

    def check(self) -> None:
        check_settings(self, "decode")
        if self.beam < 1 or self.beam % self.beam_groups:
            raise CaptionerError(f"decode.beam ({self.beam}) must be a positive multiple of decode.beam_groups "
                             f"({self.beam_groups})")
        if self.min_length > self.max_length:
            raise CaptionerError(f"decode.min_length ({self.min_length}) must not exceed decode.max_length "
                                 f"({self.max_length})")
        if not 1 <= self.n_best <= self.beam:
            raise CaptionerError(f"decode.n_best ({self.n_best}) must be between 1 and decode.beam ({self.beam})")


@dataclass
class Generation:
    """A decoded caption: word ``tokens`` (without ``<start>``, up to and excluding ``<end>``), its total
    ``log_prob`` (``<end>`` included), ``attention[name]`` (len(tokens), L) for each emitted word, and with
    ``n_best > 1`` the n best finished hypotheses ``beams``, best first (``beams[0]`` is this one)."""

    tokens: list[int]
    log_prob: float
    attention: dict[str, torch.Tensor] = field(default_factory=dict)
    beams: list["Generation"] = field(default_factory=list)


@dataclass(frozen=True)
class TokenRules:
    """Which words may come next: never ``<start>`` or ``<pad>``; never ``unk_index`` when it is set; no ``<end>``
    before ``min_length`` words; no word that would repeat an n-gram of size ``block_ngram`` (> 1) or, for 1,
    any word; no ``<end>`` right after one of the words ``open_words`` (indices); with ``ending_vocab`` (a vocabulary
    that keeps its training captions' endings), ``<end>`` only where :meth:`Vocabulary.may_end
    <captioner.data.vocabulary.Vocabulary.may_end>`."""

    start_index: int
    end_index: int
    pad_index: int = 0
    unk_index: int | None = None
    min_length: int = 0
    block_ngram: int = 0
    open_words: tuple[int, ...] = ()
    ending_vocab: Vocabulary | None = field(default=None, compare=False)

    @classmethod
    def of(cls, vocab, decode_config: DecodeConfig) -> "TokenRules":
        c = decode_config
        open_words = tuple(sorted(vocab.index[w] for w in OPEN_WORDS if w in vocab.index)) if c.no_dangling_end else ()
        if c.seen_endings and vocab.endings is None:
            raise CaptionerError("decode.seen_endings: this vocabulary was saved without its training captions' "
                                 "endings")
        return cls(vocab.start_index, vocab.end_index, vocab.pad_index, vocab.unk_index if c.suppress_unk else None,
                   c.min_length, c.block_ngram, open_words, vocab if c.seen_endings else None)

    def apply(self, log_probs: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """``log_probs`` (N, V) of the word after ``words`` (N, t), with ``-inf`` where a word is not allowed."""
        log_probs = log_probs.clone()
        banned = [self.start_index, self.pad_index] + ([self.unk_index] if self.unk_index is not None else [])
        log_probs[:, banned] = NEG_INF
        if words.shape[1] < self.min_length:
            log_probs[:, self.end_index] = NEG_INF
        if self.open_words and words.shape[1]:
            after_open = torch.isin(words[:, -1], torch.tensor(self.open_words, device=words.device))
            log_probs[after_open, self.end_index] = NEG_INF
        if self.ending_vocab is not None:
            log_probs[~self.ending_vocab.may_end(words), self.end_index] = NEG_INF
        n = self.block_ngram
        if n and words.shape[1] >= n:
            windows = words.unfold(1, n, 1)                               # (N, t-n+1, n): every n-gram so far
            if n == 1:
                log_probs.scatter_(1, words, NEG_INF)
            else:
                prefix = words[:, words.shape[1] - n + 1:]                # the last n-1 words
                same = (windows[:, :, :-1] == prefix[:, None]).all(-1)    # n-grams that start like the next one
                rows, starts = same.nonzero(as_tuple=True)
                log_probs[rows, windows[rows, starts, -1]] = NEG_INF
        return log_probs


def select_state(state: dict[str, torch.Tensor], index: torch.Tensor, keep: frozenset[str] = frozenset(),
                 keep_index: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Rows ``index`` of every state tensor (reorders or repeats hypotheses), except the entries named in
    ``keep``, which are passed on as they are, or reduced to their rows ``keep_index`` when it is given."""
    def rows(name: str, value: torch.Tensor) -> torch.Tensor:
        if name not in keep:
            return value.index_select(0, index)
        return value if keep_index is None else value.index_select(0, keep_index)
    return {name: rows(name, value) for name, value in state.items()}


def start_state(decoder, regions: torch.Tensor, per_image: int) -> tuple[dict[str, torch.Tensor], frozenset[str]]:
    """The decode state of ``regions`` (B, L, D) with ``per_image`` rows per image for the entries that change
    step by step (image b's rows adjacent), one row per image for the ``fixed_state``; and that set."""
    fixed = frozenset(getattr(decoder, "fixed_state", ()))
    state = decoder.init_state(regions)
    if per_image > 1:
        rows = torch.arange(regions.shape[0], device=regions.device).repeat_interleave(per_image)
        state = select_state(state, rows, keep=fixed)
    return state, fixed


def _stack_attention(history: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """List over steps of ``{name: (N, L)}`` -> ``{name: (N, T, L)}``."""
    if not history:
        return {}
    return {name: torch.stack([h[name] for h in history], dim=1) for name in history[0]}


def _generation(words: list[int], log_prob: float, attention: dict[str, torch.Tensor], row: int,
                end_index: int) -> Generation:
    length = words.index(end_index) if end_index in words else len(words)
    return Generation(words[:length], log_prob, {k: widened(v[row, :length]).cpu() for k, v in attention.items()})


def _generations(tokens: torch.Tensor, log_probs: torch.Tensor, attention: dict[str, torch.Tensor],
                 end_index: int) -> list[Generation]:
    """Cut each row of ``tokens`` (B, T) at its first ``<end>``."""
    return [_generation(tokens[row].tolist(), float(log_probs[row]), attention, row, end_index)
            for row in range(tokens.shape[0])]


@dataclass
class SampledCaptions:
    """Captions drawn word by word, ``samples`` per image: N = B * samples rows, image by image.

    ``tokens`` (N, T) the drawn words, ``<pad>`` after ``<end>``; ``mask`` (N, T) true where drawn (``<end>``
    included); ``log_probs`` (N, T) under the distribution drawn from (after the temperature, before
    top-k/top-p), with gradient in grad mode; ``model_log_probs`` (N, T) under the model, detached; ``entropy``
    (N, T) of each drawing distribution, detached; ``attention`` name -> (N, T, L). All but ``tokens`` are 0
    after ``<end>``."""

    tokens: torch.Tensor
    mask: torch.Tensor
    log_probs: torch.Tensor
    model_log_probs: torch.Tensor
    entropy: torch.Tensor
    attention: dict[str, torch.Tensor]

    def generations(self, end_index: int) -> list[Generation]:
        totals = self.model_log_probs.sum(dim=1)
        return _generations(self.tokens, totals, self.attention, end_index)


def image_seed(key: int | str) -> int:
    """A stable integer for an image's identity: its id, or a file name's CRC-32."""
    return key if isinstance(key, int) else zlib.crc32(str(key).encode())


def seeded_uniforms(seeds: Sequence[int], samples: int, steps: int, first_sample: int = 0) -> torch.Tensor:
    """``(len(seeds) * samples, steps)`` random numbers in [0, 1): row ``b * samples + j`` from a generator seeded
    by ``(seeds[b], first_sample + j)`` alone, so a caption's draws do not depend on the batch it is in or on
    how many other samples are drawn with it."""
    rows = []
    for seed in seeds:
        for j in range(first_sample, first_sample + samples):
            generator = torch.Generator().manual_seed((int(seed) * 1_000_003 + j) % (2**63 - 1))
            rows.append(torch.rand(steps, generator=generator))
    return torch.stack(rows)


def _truncate(log_probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``log_probs`` (N, V) with ``-inf`` outside the ``top_k`` most likely words and outside the smallest set of
    most likely words whose probabilities reach ``top_p``."""
    if top_k and top_k < log_probs.shape[1]:
        threshold = log_probs.topk(top_k, dim=1).values[:, -1:]
        log_probs = log_probs.masked_fill(log_probs < threshold, NEG_INF)
    if top_p < 1.0:
        ordered, order = log_probs.sort(dim=1, descending=True)
        before = ordered.softmax(dim=1).cumsum(dim=1) - ordered.softmax(dim=1)   # mass of the words ahead
        drop = torch.zeros_like(log_probs, dtype=torch.bool).scatter(1, order, before >= top_p)
        log_probs = log_probs.masked_fill(drop, NEG_INF)
    return log_probs


def _draw(log_probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Words (N,) drawn from ``softmax(log_probs)`` (N, V) by inverting its cumulative distribution at
    ``uniforms`` (N,): a word of zero probability is never drawn."""
    probs = torch.softmax(widened(log_probs), dim=1)
    cdf = probs.cumsum(dim=1)
    target = (uniforms.to(cdf.device, cdf.dtype) * cdf[:, -1]).clamp_min(torch.finfo(cdf.dtype).tiny)
    return (cdf < target[:, None]).sum(dim=1).clamp(max=probs.shape[1] - 1)


def sample_captions(decoder, regions: torch.Tensor, *, rules: TokenRules, max_length: int, samples: int = 1,
                    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                    uniforms: torch.Tensor | None = None) -> SampledCaptions:
    """Draw ``samples`` captions per image of ``regions`` (B, L, D) in one batched pass of B * samples rows.

    ``temperature=0`` takes the most likely word (greedy decoding); else each word is drawn from
    ``softmax(log p / temperature)``, truncated to ``top_k`` / ``top_p``, at the random numbers ``uniforms``
    (N, max_length) (e.g. :func:`seeded_uniforms`), or torch's global generator's when None. The decoder's
    ``fixed_state`` is not repeated per sample, and an image leaves the batch once all its samples have ended:
    the steps left run on the other images' rows alone. Runs with the caller's grad mode: under
    ``torch.no_grad`` for decoding, with gradients for self-critical training.
    """
    batch, device = regions.shape[0], regions.device
    rows = batch * samples
    state, fixed = start_state(decoder, regions, samples)
    live_rows = torch.arange(rows, device=device)                     # the rows of the images still in the batch
    tokens = torch.full((rows,), rules.start_index, dtype=torch.long, device=device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    words = torch.empty(rows, 0, dtype=torch.long, device=device)
    uniforms = uniforms.to(device) if uniforms is not None else None
    drawn, policy, model, entropy, history = [], [], [], [], []
    for step in range(max_length):
        everyone = len(live_rows) == rows
        log_probs, state, attention = decoder.step(tokens if everyone else tokens.index_select(0, live_rows), state)
        allowed = rules.apply(log_probs, words if everyone else words.index_select(0, live_rows))
        if temperature == 0:
            chosen, scaled = allowed.argmax(dim=1), allowed
        else:
            scaled = torch.log_softmax(allowed / temperature, dim=1)
            random = uniforms[:, step] if uniforms is not None else torch.rand(rows, device=device)
            chosen = _draw(_truncate(scaled.detach(), top_k, top_p), random if everyone else random.index_select(0, live_rows))
        live = ~finished.index_select(0, live_rows)
        chosen = chosen.masked_fill(~live, rules.pad_index)
        spread = scaled.detach()
        policy.append(_all_rows(scaled.gather(1, chosen[:, None]).squeeze(1), live, live_rows, rows))
        model.append(_all_rows(allowed.detach().gather(1, chosen[:, None]).squeeze(1), live, live_rows, rows))
        entropy.append(_all_rows(-(spread.exp() * spread.nan_to_num(neginf=0.0)).sum(dim=1), live, live_rows, rows))
        history.append({name: _all_rows(value, live, live_rows, rows) for name, value in attention.items()})
        drawn.append(_all_rows(live, live, live_rows, rows))
        tokens = torch.full_like(tokens, rules.pad_index).index_copy(0, live_rows, chosen)
        words = torch.cat([words, tokens[:, None]], dim=1)
        finished = finished | (tokens == rules.end_index)
        ended = finished.index_select(0, live_rows).view(-1, samples).all(dim=1)   # per image in the batch
        leaving = int(ended.sum())
        if leaving == len(ended):
            break
        if leaving:                           # those images leave the batch
            kept = (~ended).nonzero().squeeze(1)
            rows_kept = _rows_of(kept, samples)
            state = select_state(state, rows_kept, keep=fixed, keep_index=kept)
            live_rows = live_rows.index_select(0, rows_kept)
    return SampledCaptions(tokens=words, mask=torch.stack(drawn, 1), log_probs=torch.stack(policy, 1),
                           model_log_probs=torch.stack(model, 1), entropy=torch.stack(entropy, 1),
                           attention=_stack_attention(history))


def _rows_of(images: torch.Tensor, per_image: int) -> torch.Tensor:
    """The rows (B' * per_image,) of the images at positions ``images`` (B',) of a batch whose images hold
    ``per_image`` adjacent rows each."""
    return (images[:, None] * per_image + torch.arange(per_image, device=images.device)).flatten()


def _all_rows(value: torch.Tensor, live: torch.Tensor, live_rows: torch.Tensor, rows: int) -> torch.Tensor:
    """``value`` (n, ...) of the ``live_rows`` (n,) still in the batch -> (rows, ...), zero where ``live`` (n,) is
    false (a sample that has ended) and at the rows of the images that left the batch."""
    value = torch.where(live.view(-1, *([1] * (value.dim() - 1))), value, value.new_zeros(()))
    if len(live_rows) == rows:
        return value
    return value.new_zeros(rows, *value.shape[1:]).index_copy(0, live_rows, value)


@torch.inference_mode()
def greedy(decoder, regions: torch.Tensor, *, max_length: int, rules: TokenRules) -> list[Generation]:
    """The most likely word at every step; ``regions`` (B, L, D). Every image stops at its own ``<end>``."""
    return sample_captions(decoder, regions, rules=rules, max_length=max_length, temperature=0).generations(
        rules.end_index)


def _freeze_finished(log_probs: torch.Tensor, finished: torch.Tensor, end_index: int) -> torch.Tensor:
    """``log_probs`` (N, V) with each finished hypothesis's row (``finished`` (N,)) allowing only ``<end>``, at no
    cost: a finished hypothesis carries its score along."""
    frozen = torch.full_like(log_probs, NEG_INF)
    frozen[:, end_index] = 0.0
    return torch.where(finished[:, None], frozen, log_probs)


def _extend_history(history: dict[str, torch.Tensor], attention: dict[str, torch.Tensor],
                    origin: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-word maps ``history`` (N, T, L) of the hypotheses extended (rows ``origin`` (N,)), each with this
    step's map of ``attention`` (N, L) appended: (N, T + 1, L)."""
    for name, value in attention.items():
        past = history[name].index_select(0, origin) if name in history else value.new_empty(origin.shape[0], 0, value.shape[1])
        history[name] = torch.cat([past, value.index_select(0, origin).unsqueeze(1)], dim=1)
    return history


@torch.inference_mode()
def beam_search(decoder, regions: torch.Tensor, *, beam: int, max_length: int, rules: TokenRules,
                length_penalty: float = 0.0, groups: int = 1, diversity: float = 0.0, n_best: int = 1) -> list[Generation]:
    """Batched beam search: ``regions`` (B, L, D) -> B generations; ``beam=1`` is greedy decoding.

    The B * k hypotheses advance together; a finished one keeps its score, and an image leaves the batch once
    all its k have finished. Each answer is the best by
    ``log_prob / length**length_penalty``, its ``beams`` the ``n_best`` best. With ``groups > 1``, diverse beam
    search (Vijayakumar et al. 2018): a word an earlier group chose at this step is lowered by ``diversity``;
    scores stay log-probabilities.
    """
    batch, k, device = regions.shape[0], beam, regions.device
    size = k // groups                                             # beams per group
    state, fixed = start_state(decoder, regions, k)
    scores = torch.full((batch, k), NEG_INF, device=device)
    scores[:, ::size] = 0.0                                        # one live beam per group at the start
    tokens = torch.full((batch * k,), rules.start_index, dtype=torch.long, device=device)
    finished = torch.zeros(batch * k, dtype=torch.bool, device=device)
    lengths = torch.zeros(batch * k, dtype=torch.long, device=device)
    words = torch.empty(batch * k, 0, dtype=torch.long, device=device)
    history: dict[str, torch.Tensor] = {}
    images = torch.arange(batch, device=device)                    # the searched images, in their rows' order
    base = (images * k).unsqueeze(1)                               # (B', 1) each image's first row
    out: list[Generation | None] = [None] * batch
    for _ in range(max_length):
        log_probs, state, attention = decoder.step(tokens, state)
        log_probs = rules.apply(log_probs, words)
        log_probs = _freeze_finished(log_probs, finished, rules.end_index)
        scores, origin, tokens = _choose(scores, log_probs, finished.view(-1, k), groups, diversity)
        origin = (base + origin).view(-1)                          # rows of the hypotheses extended
        tokens = tokens.view(-1)
        lengths = lengths.index_select(0, origin) + (~finished.index_select(0, origin)).long()
        finished = finished.index_select(0, origin) | (tokens == rules.end_index)
        words = torch.cat([words.index_select(0, origin), tokens[:, None]], dim=1)
        state = select_state(state, origin, keep=fixed)
        history = _extend_history(history, attention, origin)
        done = finished.view(-1, k).all(dim=1)                     # images whose k hypotheses all ended
        if done.all():
            break
        if done.any():
            # Those images' answers are final: they leave the batch, and the steps left run on the others alone.
            gone = done.repeat_interleave(k)
            _keep_best(out, images[done], scores[done], lengths[gone], words[gone],
                       {name: value[gone] for name, value in history.items()}, rules.end_index, length_penalty, n_best)
            kept = (~done).nonzero().squeeze(1)
            rows = _rows_of(kept, k)
            images, scores, base = images[kept], scores[kept], base[:kept.shape[0]]
            tokens, finished, lengths, words = (t.index_select(0, rows) for t in (tokens, finished, lengths, words))
            history = {name: value.index_select(0, rows) for name, value in history.items()}
            state = select_state(state, rows, keep=fixed, keep_index=kept)
    _keep_best(out, images, scores, lengths, words, history, rules.end_index, length_penalty, n_best)
    return out


def _keep_best(out: list, images: torch.Tensor, scores: torch.Tensor, lengths: torch.Tensor, words: torch.Tensor,
               history: dict[str, torch.Tensor], end_index: int, length_penalty: float, n_best: int) -> None:
    """Write into ``out[image]`` the answer of each of ``images`` (B') from its k hypotheses: ``scores`` (B', k),
    ``lengths`` (B' * k,), ``words`` (B' * k, t), ``history`` name -> (B' * k, t, L). The answer is the best
    hypothesis by ``log_prob / length**length_penalty``, with the ``n_best`` best in ``beams`` when n_best > 1."""
    count, k = scores.shape
    ranking = scores.view(-1) / lengths.clamp(min=1).float() ** length_penalty if length_penalty else scores.view(-1)
    base = (torch.arange(count, device=scores.device) * k).unsqueeze(1)
    order = ranking.view(count, k).argsort(dim=1, descending=True, stable=True)[:, :n_best] + base   # (B', n)
    flat = scores.view(-1)
    for position, image in enumerate(images.tolist()):
        beams = [_generation(words[row].tolist(), float(flat[row]), history, row, end_index)
                 for row in order[position].tolist()]
        out[image] = Generation(beams[0].tokens, beams[0].log_prob, beams[0].attention, beams if n_best > 1 else [])


def _choose(scores: torch.Tensor, log_probs: torch.Tensor, finished: torch.Tensor, groups: int, diversity: float
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of (diverse) beam search: ``scores`` (B, k) and ``log_probs`` (B * k, V) -> the new scores (B, k),
    the beam each new hypothesis extends (B, k) and its word (B, k). ``finished`` (B, k) marks finished beams."""
    batch, k = scores.shape
    vocab, size = log_probs.shape[1], k // groups
    totals = (scores.view(-1, 1) + log_probs).view(batch, groups, size, vocab)
    if groups == 1:
        new_scores, flat = totals.view(batch, size * vocab).topk(size, dim=1)
        return new_scores, flat // vocab, flat % vocab
    chosen_words = totals.new_zeros(batch, vocab)                    # live choices of earlier groups, this step
    parts = []
    for group in range(groups):
        live = ~finished[:, group * size:(group + 1) * size]            # (B, size)
        steered = totals[:, group] - diversity * chosen_words[:, None, :] * live[:, :, None]
        _, flat = steered.reshape(batch, size * vocab).topk(size, dim=1)
        beam, word = flat // vocab, flat % vocab
        new_scores = totals[:, group].reshape(batch, size * vocab).gather(1, flat)
        chosen_words.scatter_add_(1, word, live.gather(1, beam).to(chosen_words.dtype))
        parts.append((new_scores, beam + group * size, word))
    return tuple(torch.cat(part, dim=1) for part in zip(*parts))


class PriorAdjusted:
    """A decoder whose next-word distribution is the wrapped one's divided by the training prior to the power
    ``tau``: ``log_softmax(log p(w | ...) - tau * log prior(w))`` (logit adjustment, Menon et al. 2021), which
    favours the rare words a model trained towards CIDEr stops using. ``log_prior`` (V,); the words ``never``
    emitted (``<pad>``, ``<start>``) take no share of the renormalised mass."""

    def __init__(self, decoder, log_prior: torch.Tensor, tau: float, never: Sequence[int] = ()):
        self.decoder, self.shift = decoder, -tau * log_prior
        self.shift[list(never)] = NEG_INF
        self.fixed_state = getattr(decoder, "fixed_state", ())

    def init_state(self, regions: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.decoder.init_state(regions)

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor]):
        log_probs, state, attention = self.decoder.step(tokens, state)
        shifted = widened(log_probs) + self.shift.to(log_probs.device)
        return torch.log_softmax(shifted, dim=1).to(log_probs.dtype), state, attention


def decode(decoder, regions: torch.Tensor, vocab, decode_config: DecodeConfig,
           images: Sequence[int | str] | None = None) -> list[Generation]:
    """Captions of ``regions`` (B, L, D) as ``decode_config`` says: beam search (greedy for a beam of 1) or sampling.
    ``images`` (ids or file names) seed each image's draws when sampling, so that an image gets the same
    caption whatever batch it is decoded in (default: its position in the batch)."""
    c = decode_config
    c.check()
    rules = TokenRules.of(vocab, c)
    if c.logit_adjustment:
        decoder = PriorAdjusted(decoder, vocab.log_prior(), c.logit_adjustment, (rules.pad_index, rules.start_index))
    if c.method == "sample":
        keys = images if images is not None else range(regions.shape[0])
        seeds = [c.seed * 1_000_033 + image_seed(key) for key in keys]
        with torch.inference_mode():
            drawn = sample_captions(decoder, regions, rules=rules, max_length=c.max_length,
                                    temperature=c.temperature, top_k=c.top_k, top_p=c.top_p,
                                    uniforms=seeded_uniforms(seeds, 1, c.max_length).to(regions.device))
        return drawn.generations(rules.end_index)
    if c.beam == 1:
        return greedy(decoder, regions, max_length=c.max_length, rules=rules)
    return beam_search(decoder, regions, beam=c.beam, max_length=c.max_length, rules=rules,
                       length_penalty=c.length_penalty, groups=c.beam_groups,
                       diversity=c.diversity, n_best=c.n_best)
