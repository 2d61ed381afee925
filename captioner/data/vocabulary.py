"""Tokeniser and vocabulary.

Tokenisation needs no downloaded data: captions are lower-cased, letters and digits of any script form
words, apostrophes and hyphens inside words are kept, and every other character separates tokens (the documented regex
``TOKEN_PATTERN``). Punctuation is dropped, as in the Karpathy preprocessing most captioning code uses.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

TOKEN_PATTERN = re.compile(r"[^\W_]+(?:['\-][^\W_]+)*")

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)


def tokenize(text: str) -> list[str]:
    """Lower-case ``text`` and split it into word tokens: ``"A dog's ball."`` -> ``["a", "dog's", "ball"]``."""
    return TOKEN_PATTERN.findall(text.lower())


class Vocabulary:
    """Word <-> index mapping with ``<pad>=0, <start>=1, <end>=2, <unk>=3``.

    ``words`` is the full ordered list (specials first); it is all a checkpoint needs to restore the
    mapping exactly (see :meth:`to_dict` / :meth:`from_dict`).
    """

    pad_index, start_index, end_index, unk_index = 0, 1, 2, 3

    def __init__(self, words: Sequence[str]):
        if tuple(words[:4]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with {SPECIALS}, got {tuple(words[:4])}")
        if len(set(words)) != len(words):
            raise ValueError("vocabulary words must be unique")
        self.words = list(words)
        self.index = {word: i for i, word in enumerate(self.words)}

    @classmethod
    def build(cls, captions: Iterable[str], min_count: int = 5, max_size: int | None = None) -> "Vocabulary":
        """Keep the words seen at least ``min_count`` times, most frequent first (ties alphabetical),
        at most ``max_size`` words in all (specials included)."""
        counts = Counter(token for caption in captions for token in tokenize(caption))
        kept = sorted((w for w, c in counts.items() if c >= min_count and w not in SPECIALS),
                      key=lambda w: (-counts[w], w))
        if max_size is not None:
            kept = kept[: max(0, max_size - len(SPECIALS))]
        return cls(list(SPECIALS) + kept)

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

    def to_dict(self) -> dict:
        return {"words": list(self.words)}

    @classmethod
    def from_dict(cls, state: dict) -> "Vocabulary":
        return cls(state["words"])


def save_vocabulary(vocab: Vocabulary, path: str | Path) -> None:
    """Write ``{"words": [...]}`` as JSON (atomically)."""
    import json

    from captioner.utils import atomic_write

    atomic_write(path, lambda handle: handle.write(json.dumps(vocab.to_dict(), ensure_ascii=False).encode()))


def load_vocabulary(path: str | Path) -> Vocabulary:
    """A vocabulary written by :func:`save_vocabulary`; clear errors for a missing or malformed file."""
    from captioner.data.readers import read_json
    from captioner.errors import CaptionerError

    data = read_json(path)
    try:
        return Vocabulary.from_dict(data)
    except (KeyError, TypeError, ValueError) as err:
        raise CaptionerError(f"{path}: not a vocabulary file ({type(err).__name__}: {err})") from None


def training_vocabulary(data_config: dict, train_records) -> Vocabulary:
    """The vocabulary a new run uses: the ``data.vocab`` file when set, else built from the train captions
    with ``data.vocab_min_count`` and ``data.vocab_max_size``."""
    if data_config.get("vocab"):
        return load_vocabulary(data_config["vocab"])
    return Vocabulary.build((c for r in train_records for c in r.captions), data_config["vocab_min_count"],
                            data_config["vocab_max_size"])
