"""The vocabulary: word <-> index, built from training captions (tokenised by :mod:`captioner.data.text`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from captioner.core.files import read_json, write_file
from captioner.data.config import DataConfig
from captioner.data.readers import read_split
from captioner.data.text import OPEN_WORDS, tokenize
from captioner.data.tokens import END_INDEX, PAD_INDEX, SPECIALS, START_INDEX, UNK_INDEX
from captioner.errors import CaptionerError


class Vocabulary:
    """Word <-> index mapping with ``<pad>=0, <start>=1, <end>=2, <unk>=3``.

    ``words`` is the full ordered list (specials first); it is all a checkpoint needs to restore the
    mapping exactly (see :meth:`to_dict` / :meth:`from_dict`). ``counts``, when known, is each word's count in
    the training captions (``<end>``: one per caption; ``<unk>``: the words left out), for :meth:`log_prior`.
    ``endings``, when known, are the last two words of the training captions as sorted index pairs (``<start>``
    before a one-word caption, ``<unk>`` for a word left out), for :meth:`may_end`.
    """

    pad_index, start_index, end_index, unk_index = PAD_INDEX, START_INDEX, END_INDEX, UNK_INDEX

    def __init__(self, words: Sequence[str], counts: Sequence[int] | None = None,
                 endings: Iterable[Sequence[int]] | None = None):
        if tuple(words[:4]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {SPECIALS}, got {tuple(words[:4])}")
        if len(set(words)) != len(words):
            raise ValueError("vocabulary words must be unique")
        if counts is not None and (len(counts) != len(words) or not all(type(c) is int and c >= 0 for c in counts)):
            raise ValueError(f"vocabulary counts must be {len(words)} non-negative integers, one per word")
        if endings is not None:
            endings = sorted({tuple(pair) for pair in endings})
            if not all(len(pair) == 2 and all(type(i) is int and 0 <= i < len(words) for i in pair)
                       for pair in endings):
                raise ValueError(f"vocabulary endings must be pairs of word indices below {len(words)}")
        self.words = list(words)
        self.counts = None if counts is None else list(counts)
        self.endings = endings
        self.index = {word: i for i, word in enumerate(self.words)}
        self._ending_tables: tuple[torch.Tensor, ...] | None = None

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 5, max_size: int | None = None) -> "Vocabulary":
        """Keep the words seen at least ``min_count`` times, most frequent first (ties alphabetical),
        at most ``max_size`` words in all (specials included)."""
        return cls.from_counts(caption_counts(captions), min_count, max_size)

    @classmethod
    def from_counts(cls, counted: "CaptionCounts", min_count: int = 5, max_size: int | None = None) -> "Vocabulary":
        """:meth:`build` from what :func:`caption_counts` counted."""
        counts = counted.words
        kept = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
                      key=lambda w: (-counts[w], w))
        if max_size is not None:
            kept = kept[: max(0, max_size - len(SPECIALS))]
        return cls.counted(list(SPECIALS) + kept, counted)

    @classmethod
    def counted(cls, words: Sequence[str], counted: "CaptionCounts") -> "Vocabulary":
        """``words`` (specials first) with their counts and endings in the captions ``counted``: ``<end>`` once per
        caption, ``<unk>`` every word left out."""
        counts = counted.words
        known = [counts.get(word, 0) for word in words[len(SPECIALS):]]
        index = {word: i for i, word in enumerate(words)}
        endings = {tuple(index.get(word, UNK_INDEX) for word in pair) for pair in counted.endings}
        return cls(words, [0, 0, counted.captions, sum(counts.values()) - sum(known)] + known, endings)

    def __len__(self) -> int:
        return len(self.words)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.words == other.words

    def encode(self, caption: str, max_length: int) -> list[int]:
        """``<start> w1 .. wn <end>`` as indices, the words cut to ``max_length``; unknown words -> ``<unk>``."""
        tokens = tokenize(caption)[:max_length]
        return [self.start_index] + [self.index.get(t, self.unk_index) for t in tokens] + [self.end_index]

    def decode(self, indices: Iterable[int]) -> str:
        """Words up to the first ``<end>``, skipping ``<start>`` and ``<pad>``."""
        return " ".join(self.decode_tokens(indices))

    def decode_tokens(self, indices: Iterable[int]) -> list[str]:
        """As :meth:`decode`, but the list of words."""
        out = []
        for i in indices:
            i = int(i)
            if i == self.end_index:
                break
            if i in (self.start_index, self.pad_index):
                continue
            out.append(self.words[i])
        return out

    def log_prior(self) -> torch.Tensor:
        """(V,) the log of each word's share of the training words (``<end>`` included; a word never counted
        as if counted once)."""
        if self.counts is None:
            raise CaptionerError("this vocabulary was saved without its training counts")
        counts = torch.tensor(self.counts, dtype=torch.float64).clamp(min=1)
        return (counts / counts.sum()).log().to(torch.get_default_dtype())

    def may_end(self, tokens: torch.Tensor) -> torch.Tensor:
        """Per row of ``tokens`` (N, t) of words (no ``<start>``), whether a caption may stop there, by the
        training captions' endings: its last word ends one of them, and where the word before is an open word
        (:data:`~captioner.data.text.OPEN_WORDS`, or ``<start>``), the two words end one ("on a dirt" does not,
        "a red bed" may where "bed" ends some caption); never with no words. (N,) bool."""
        if self.endings is None:
            raise CaptionerError("this vocabulary was saved without its training captions' endings")
        if not tokens.shape[1]:
            return torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
        if self._ending_tables is None or self._ending_tables[0].device != tokens.device:
            pairs = torch.tensor(self.endings, dtype=torch.long).reshape(-1, 2)
            last_words = torch.zeros(len(self), dtype=torch.bool)
            last_words[pairs[:, 1]] = True
            open_words = torch.zeros(len(self), dtype=torch.bool)
            open_words[[self.start_index, *(self.index[w] for w in OPEN_WORDS if w in self.index)]] = True
            self._ending_tables = tuple(t.to(tokens.device) for t in (pairs[:, 0] * len(self) + pairs[:, 1],
                                                                      last_words, open_words))
        codes, last_words, open_words = self._ending_tables
        last = tokens[:, -1]
        before = tokens[:, -2] if tokens.shape[1] > 1 else torch.full_like(last, self.start_index)
        return torch.isin(before * len(self) + last, codes) | (~open_words[before] & last_words[last])

    def to_dict(self) -> dict:
        return ({"words": list(self.words)} | ({"counts": list(self.counts)} if self.counts is not None else {})
                | ({"endings": [list(pair) for pair in self.endings]} if self.endings is not None else {}))

    @classmethod
    def from_dict(cls, state: dict) -> "Vocabulary":
        return cls(state["words"], state.get("counts"), state.get("endings"))


@dataclass
class CaptionCounts:
    """What a vocabulary keeps of its training captions: each word's count, the number of captions, and each
    caption's last two words (``<start>`` before a one-word caption)."""

    words: Counter = field(default_factory=Counter)
    captions: int = 0
    endings: set[tuple[str, str]] = field(default_factory=set)

    def add(self, tokens: Sequence[str]) -> None:
        """Count one caption's ``tokens``."""
        self.words.update(tokens)
        self.captions += 1
        if tokens:
            self.endings.add(tuple(["<start>", *tokens][-2:]))


def caption_counts(captions: Iterable[str]) -> CaptionCounts:
    """:class:`CaptionCounts` of ``captions`` (tokenised)."""
    counted = CaptionCounts()
    for caption in captions:
        counted.add(tokenize(caption))
    return counted


def save_vocabulary(vocab: Vocabulary, path: str | Path) -> None:
    """Write ``{"words": [...], "counts": [...], "endings": [...]}`` (:meth:`Vocabulary.to_dict`) as JSON
    (atomically; a failed write names ``path``)."""
    write_file(path, json.dumps(vocab.to_dict(), ensure_ascii=False))


def load_vocabulary(path: str | Path) -> Vocabulary:
    """A vocabulary written by :func:`save_vocabulary`; clear errors for a missing or malformed file."""
    data = read_json(path)
    try:
        return Vocabulary.from_dict(data)
    except (KeyError, TypeError, ValueError) as err:
        raise CaptionerError(f"{path}: not a vocabulary file ({type(err).__name__}: {err})") from None


def training_vocabulary(data_config: DataConfig, train_records) -> Vocabulary:
    """The vocabulary a new run uses: the ``data.vocab`` file when set (counted on the train captions if it was
    written without counts or endings), else built from the train captions with ``data.vocab_min_count`` and
    ``data.vocab_max_size``."""
    if data_config.vocab:
        return with_training_counts(load_vocabulary(data_config.vocab), data_config, train_records)
    return Vocabulary.build((c for r in train_records for c in r.captions), data_config.vocab_min_count,
                            data_config.vocab_max_size)


def with_training_counts(vocab: Vocabulary, data_config: DataConfig, train_records=None) -> Vocabulary:
    """``vocab`` with its words' counts and endings in the train captions of ``data_config`` (``train_records`` when
    already read) where it was saved without them (a checkpoint of an earlier version, a vocabulary file); what it
    kept stays, and a vocabulary that kept both is returned as it is, its captions not read."""
    if vocab.counts is not None and vocab.endings is not None:
        return vocab
    records = read_split(data_config, "train") if train_records is None else train_records
    counted = Vocabulary.counted(vocab.words, caption_counts(c for record in records for c in record.captions))
    return Vocabulary(vocab.words, counted.counts if vocab.counts is None else vocab.counts,
                      counted.endings if vocab.endings is None else vocab.endings)


def vocabulary_report(data_config: DataConfig, out: str | Path | None = None) -> dict:
    """Build the vocabulary of the train split (``data.vocab_min_count``, ``data.vocab_max_size``), write it to
    ``out`` (default ``data.vocab``) and report its size, token coverage and caption lengths."""
    out = out or data_config.vocab
    if not out:
        raise CaptionerError("data vocab: set data.vocab in the config (or pass --out FILE)")
    counted, lengths = CaptionCounts(), []
    for record in read_split(data_config, "train"):     # each caption tokenised once, its tokens not kept
        for caption in record.captions:
            tokens = tokenize(caption)
            counted.add(tokens)
            lengths.append(len(tokens))
    counts = counted.words
    vocab = Vocabulary.from_counts(counted, data_config.vocab_min_count, data_config.vocab_max_size)
    covered = sum(n for word, n in counts.items() if word in vocab.index)
    lengths.sort()
    save_vocabulary(vocab, out)
    return {"vocabulary": str(out), "words": len(vocab), "train_captions": len(lengths),
            "distinct_train_words": len(counts), "token_coverage": round(covered / max(sum(counts.values()), 1), 4),
            "caption_length_p50_p95_max": [lengths[len(lengths) // 2], lengths[int(len(lengths) * 0.95)],
                                           lengths[-1]] if lengths else None,
            "cut_at_max_caption_length": sum(n > data_config.max_caption_length for n in lengths)}
