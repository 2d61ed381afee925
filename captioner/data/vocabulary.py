"""The vocabulary: word <-> index, built from training captions (tokenised by :mod:`captioner.data.text`)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch

from captioner.core.files import read_json, write_file
from captioner.data.config import DataConfig
from captioner.data.readers import read_split
from captioner.data.text import tokenize
from captioner.data.tokens import END_INDEX, PAD_INDEX, SPECIALS, START_INDEX, UNK_INDEX
from captioner.errors import CaptionerError


class Vocabulary:
    """Word <-> index mapping with ``<pad>=0, <start>=1, <end>=2, <unk>=3``.

    ``words`` is the full ordered list (specials first); it is all a checkpoint needs to restore the
    mapping exactly (see :meth:`to_dict` / :meth:`from_dict`). ``counts``, when known, is each word's count in
    the training captions (``<end>``: one per caption; ``<unk>``: the words left out), for :meth:`log_prior`.
    """

    pad_index, start_index, end_index, unk_index = PAD_INDEX, START_INDEX, END_INDEX, UNK_INDEX

    def __init__(self, words: Sequence[str], counts: Sequence[int] | None = None):
        if tuple(words[:4]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {SPECIALS}, got {tuple(words[:4])}")
        if len(set(words)) != len(words):
            raise ValueError("vocabulary words must be unique")
        if counts is not None and (len(counts) != len(words) or any(int(c) < 0 for c in counts)):
            raise ValueError(f"vocabulary counts must be {len(words)} non-negative numbers, one per word")
        self.words = list(words)
        self.counts = None if counts is None else [int(c) for c in counts]
        self.index = {word: i for i, word in enumerate(self.words)}

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 5, max_size: int | None = None) -> "Vocabulary":
        """Keep the words seen at least ``min_count`` times, most frequent first (ties alphabetical),
        at most ``max_size`` words in all (specials included)."""
        counts, number = word_counts(captions)
        return cls.from_counts(counts, min_count, max_size, captions=number)

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], min_count: int = 5, max_size: int | None = None,
                    captions: int = 0) -> "Vocabulary":
        """:meth:`build` from the words' counts and the number of ``captions`` they came from."""
        kept = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
                      key=lambda w: (-counts[w], w))
        if max_size is not None:
            kept = kept[: max(0, max_size - len(SPECIALS))]
        return cls.counted(list(SPECIALS) + kept, counts, captions)

    @classmethod
    def counted(cls, words: Sequence[str], counts: Mapping[str, int], captions: int) -> "Vocabulary":
        """``words`` (specials first) with their ``counts`` in ``captions`` captions: ``<end>`` once per caption,
        ``<unk>`` every word left out."""
        known = [counts.get(word, 0) for word in words[len(SPECIALS):]]
        return cls(words, [0, 0, captions, sum(counts.values()) - sum(known)] + known)

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
        return (counts / counts.sum()).log().float()

    def to_dict(self) -> dict:
        return {"words": list(self.words)} | ({"counts": list(self.counts)} if self.counts is not None else {})

    @classmethod
    def from_dict(cls, state: dict) -> "Vocabulary":
        return cls(state["words"], state.get("counts"))


def word_counts(captions: Iterable[str]) -> tuple[Counter, int]:
    """How often each word occurs in ``captions`` (tokenised), and how many captions there were."""
    counts, number = Counter(), 0
    for caption in captions:
        counts.update(tokenize(caption))
        number += 1
    return counts, number


def save_vocabulary(vocab: Vocabulary, path: str | Path) -> None:
    """Write ``{"words": [...], "counts": [...]}`` as JSON (atomically; a failed write names ``path``)."""
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
    written without counts), else built from the train captions with ``data.vocab_min_count`` and
    ``data.vocab_max_size``."""
    if data_config.vocab:
        vocab = load_vocabulary(data_config.vocab)
        return vocab if vocab.counts is not None else with_training_counts(vocab, data_config, train_records)
    return Vocabulary.build((c for r in train_records for c in r.captions), data_config.vocab_min_count,
                            data_config.vocab_max_size)


def with_training_counts(vocab: Vocabulary, data_config: DataConfig, train_records=None) -> Vocabulary:
    """``vocab`` with its words' counts in the train captions of ``data_config`` (``train_records`` when already
    read): for a vocabulary saved without them (a checkpoint of an earlier version, a vocabulary file)."""
    records = read_split(data_config, "train") if train_records is None else train_records
    counts, captions = word_counts(c for record in records for c in record.captions)
    return Vocabulary.counted(vocab.words, counts, captions)


def vocabulary_report(data_config: DataConfig, out: str | Path | None = None) -> dict:
    """Build the vocabulary of the train split (``data.vocab_min_count``, ``data.vocab_max_size``), write it to
    ``out`` (default ``data.vocab``) and report its size, token coverage and caption lengths."""
    out = out or data_config.vocab
    if not out:
        raise CaptionerError("data vocab: set data.vocab in the config (or pass --out FILE)")
    counts, lengths = Counter(), []
    for record in read_split(data_config, "train"):     # each caption tokenised once, its tokens not kept
        for caption in record.captions:
            tokens = tokenize(caption)
            counts.update(tokens)
            lengths.append(len(tokens))
    vocab = Vocabulary.from_counts(counts, data_config.vocab_min_count, data_config.vocab_max_size,
                                   captions=len(lengths))
    covered = sum(n for word, n in counts.items() if word in vocab.index)
    lengths.sort()
    save_vocabulary(vocab, out)
    return {"vocabulary": str(out), "words": len(vocab), "train_captions": len(lengths),
            "distinct_train_words": len(counts), "token_coverage": round(covered / max(sum(counts.values()), 1), 4),
            "caption_length_p50_p95_max": [lengths[len(lengths) // 2], lengths[int(len(lengths) * 0.95)],
                                           lengths[-1]] if lengths else None,
            "cut_at_max_caption_length": sum(n > data_config.max_caption_length for n in lengths)}
