"""The tokeniser: captions to word tokens, with no downloaded data.

Captions are lower-cased, letters and digits of any script form words, apostrophes and hyphens inside words
are kept, and every other character separates tokens (the documented regex ``TOKEN_PATTERN``). Punctuation
is dropped, as in the Karpathy preprocessing most captioning code uses.
"""

from __future__ import annotations

import re

TOKEN_PATTERN = re.compile(r"[^\W_]+(?:['\-][^\W_]+)*")


def tokenize(text: str) -> list[str]:
    """Lower-case ``text`` and split it into word tokens: ``"A dog's ball."`` -> ``["a", "dog's", "ball"]``."""
    return TOKEN_PATTERN.findall(text.lower())


def has_words(text: str) -> bool:
    """Whether :func:`tokenize` finds a word in ``text`` (without making the list)."""
    return TOKEN_PATTERN.search(text.lower()) is not None
