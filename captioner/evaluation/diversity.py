"""How varied and how clean are a split's captions? Measures that make decoding options comparable.

* ``vocabulary_used``: distinct words over all captions;
* ``distinct_captions``: share of images whose caption no other image got;
* ``repeated_word``: share of captions with the same word twice in a row ("a dog dog");
* ``repeated_bigram``: share of captions in which a pair of words occurs twice ("a man on a man on");
* ``dangling_end``: share of captions that stop on a word that cannot end an English caption ("a", "of",
  "with", ...), the mark of a caption cut short;
* ``mean_length``: words per caption;
* ``unseen_end`` (:func:`unseen_endings`, where the vocabulary keeps its training captions' endings): share of
  captions that stop where no training caption would ("on a dirt"), which ``dangling_end`` misses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from captioner.data.text import OPEN_WORDS

DANGLING = OPEN_WORDS | {"<unk>"}      # a final <unk> marks a caption cut short too


def diversity_measures(captions: Mapping[int, str]) -> dict[str, float]:
    """The measures above over ``{image_id: caption}``."""
    words = {image: caption.split() for image, caption in captions.items()}
    count = max(len(words), 1)
    frequency = Counter(captions.values())

    def has_repeated_bigram(tokens: list[str]) -> bool:
        bigrams = list(zip(tokens, tokens[1:]))
        return len(bigrams) != len(set(bigrams))

    return {
        "vocabulary_used": len({w for tokens in words.values() for w in tokens}),
        "distinct_captions": sum(frequency[c] == 1 for c in captions.values()) / count,
        "repeated_word": sum(any(a == b for a, b in zip(t, t[1:])) for t in words.values()) / count,
        "repeated_bigram": sum(has_repeated_bigram(t) for t in words.values()) / count,
        "dangling_end": sum(bool(t) and t[-1] in DANGLING for t in words.values()) / count,
        "mean_length": sum(len(t) for t in words.values()) / count,
    }


def unseen_endings(captions: Mapping[int, str], vocab) -> float:
    """Share of ``{image_id: caption}`` that stop where no training caption of ``vocab`` would
    (:meth:`Vocabulary.may_end <captioner.data.vocabulary.Vocabulary.may_end>`; an empty caption among them, and a
    caption cut at the length limit where it was cut)."""
    import torch

    last_two = [[vocab.index.get(w, vocab.unk_index) for w in ["<start>", *caption.split()][-2:]]
                for caption in captions.values()]
    whole = [pair for pair in last_two if len(pair) == 2]
    stopped = int(vocab.may_end(torch.tensor(whole, dtype=torch.long).reshape(-1, 2)).sum()) if whole else 0
    return (len(last_two) - stopped) / max(len(last_two), 1)
