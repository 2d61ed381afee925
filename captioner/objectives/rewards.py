"""Sentence rewards for self-critical training: CIDEr-D against an image's references, optionally mixed with
BLEU-4.

:class:`CiderD` is the CIDEr-D of pycocoevalcap's ``Cider`` (n = 1..4, tf-idf weights with the document
frequencies of a reference corpus, clipped counts, a gaussian length penalty with sigma = 6, times 10), with
the corpus statistics computed once: document frequencies over the training references (cached on disk,
keyed by the references themselves) and every reference's tf-idf vector. A candidate then costs its own
n-gram counts and one sparse dot product per reference. pycocoevalcap computes "length" as the number of
bigrams (one less than the words); so does this, so that its scores equal ``Cider``'s to the last digit.

With ``count_end`` (the public self-critical code's habit) every reference ends with the word ``<end>``, and so
does every candidate that ended (one cut at the length limit does not): n-grams that close a caption are then
rewarded, and captions learn where to stop.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from captioner.core.files import atomic_write

log = logging.getLogger(__name__)

END_WORD = "<end>"
NGRAMS = 4
SIGMA = 6.0

Ngram = tuple[str, ...]


def ngram_counts(words: Sequence[str], n: int = NGRAMS) -> Counter:
    """Counts of every 1..n-gram of ``words``."""
    return Counter(tuple(words[i:i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1))


class TfIdf:
    """A caption as CIDEr sees it: per n, its tf-idf weights, their norm, and its "length" (bigram count)."""

    __slots__ = ("weights", "norms", "length")

    def __init__(self, counts: Counter, document_frequency: Mapping[Ngram, float], log_images: float):
        self.weights: list[dict[Ngram, float]] = [{} for _ in range(NGRAMS)]
        for ngram, count in counts.items():
            self.weights[len(ngram) - 1][ngram] = count * (log_images - math.log(max(1.0, document_frequency.get(ngram, 0.0))))
        self.norms = [math.sqrt(sum(v * v for v in w.values())) for w in self.weights]
        self.length = sum(c for g, c in counts.items() if len(g) == 2)

    def similarity(self, reference: "TfIdf") -> float:
        """Mean over n of the clipped cosine similarity, times the length penalty (one reference)."""
        penalty = math.exp(-((self.length - reference.length) ** 2) / (2 * SIGMA**2))
        total = 0.0
        for n in range(NGRAMS):
            mine, theirs = self.weights[n], reference.weights[n]
            dot = sum(min(v, theirs[g]) * theirs[g] for g, v in mine.items() if g in theirs)
            if self.norms[n] and reference.norms[n]:
                dot /= self.norms[n] * reference.norms[n]
            total += dot * penalty
        return total / NGRAMS


class CiderD:
    """CIDEr-D of candidate captions against the references of their image, with the document frequencies of
    a reference corpus (by default the references themselves).

    ``references``: ``{image_id: [caption words, ...]}``. ``document_frequency``: ``{ngram: images}`` from
    :func:`document_frequencies`, with ``images`` the corpus size, when they come from another corpus."""

    def __init__(self, references: Mapping[int, Sequence[Sequence[str]]], *, count_end: bool = False,
                 document_frequency: Mapping[Ngram, float] | None = None, images: int | None = None):
        self.count_end = count_end
        refs = {image: [self._words(r) for r in captions] for image, captions in references.items()}
        if document_frequency is None:
            document_frequency, images = document_frequencies(refs.values()), len(refs)
        self.document_frequency, self.log_images = document_frequency, math.log(float(images))
        self.references = {image: [TfIdf(ngram_counts(r), self.document_frequency, self.log_images) for r in captions]
                           for image, captions in refs.items()}

    def _words(self, caption: Sequence[str], ended: bool = True) -> list[str]:
        return list(caption) + [END_WORD] if self.count_end and ended else list(caption)

    def score(self, caption: Sequence[str], image_id: int, ended: bool = True) -> float:
        """CIDEr-D of ``caption`` (its words) for ``image_id``; ``ended``: it closed with ``<end>``."""
        candidate = TfIdf(ngram_counts(self._words(caption, ended)), self.document_frequency, self.log_images)
        references = self.references[image_id]
        return 10.0 * sum(candidate.similarity(r) for r in references) / len(references)

    def scores(self, captions: Sequence[Sequence[str]], image_ids: Sequence[int],
               ended: Sequence[bool] | None = None) -> np.ndarray:
        """:meth:`score` per caption; ``ended`` per caption (default: every one ended)."""
        ended = [True] * len(captions) if ended is None else ended
        return np.array([self.score(c, i, e) for c, i, e in zip(captions, image_ids, ended)], dtype=np.float64)


def document_frequencies(corpus) -> dict[Ngram, float]:
    """``{ngram: number of images whose references contain it}`` over ``corpus`` (per image, a list of captions'
    words)."""
    frequency: Counter = Counter()
    for captions in corpus:
        frequency.update({g for words in captions for g in ngram_counts(words)})
    return {g: float(c) for g, c in frequency.items()}


def cached_cider(references: Mapping[int, Sequence[Sequence[str]]], folder: str | Path | None, *,
                 count_end: bool) -> CiderD:
    """:class:`CiderD` over the training ``references``, its document frequencies read from (or written to)
    ``folder/cider-df-<key>.json.gz``, the key a hash of the references: computed once per training split."""
    refs = {image: [list(r) + ([END_WORD] if count_end else []) for r in captions] for image, captions in references.items()}
    key = hashlib.sha256(json.dumps(sorted((int(i), c) for i, c in refs.items())).encode()).hexdigest()[:16]
    path = Path(folder) / f"cider-df-{key}.json.gz" if folder else None
    if path is not None and path.exists():
        stored = json.loads(gzip.decompress(path.read_bytes()))
        frequency = {tuple(g.split(" ")): c for g, c in stored["df"].items()}
        images = stored["images"]
    else:
        frequency, images = document_frequencies(refs.values()), len(refs)
        if path is not None:
            data = json.dumps({"images": images, "df": {" ".join(g): c for g, c in frequency.items()}}).encode()
            try:
                atomic_write(path, lambda handle: handle.write(gzip.compress(data)))
            except OSError as err:   # a read-only cache folder costs a recomputation next time, nothing else
                log.warning("%s: cannot cache CIDEr-D document frequencies (%s)", path, err.strerror or err)
    return CiderD(references, count_end=count_end, document_frequency=frequency, images=images)


def sentence_bleu4(caption: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """pycocoevalcap's per-sentence BLEU-4: clipped n-gram precisions with its smoothing constants and the
    brevity penalty against the closest reference length."""
    counts = ngram_counts(caption)
    clip: Counter = Counter()
    for reference in references:
        clip |= ngram_counts(reference)
    correct = [0] * NGRAMS
    for ngram, count in counts.items():
        correct[len(ngram) - 1] += min(clip.get(ngram, 0), count)
    length = len(caption)
    closest = min((abs(len(r) - length), len(r)) for r in references)[1]
    score = 1.0
    for k in range(NGRAMS):
        score *= (correct[k] + 1e-15) / (max(0, length - k) + 1e-9)
    score **= 1.0 / NGRAMS
    ratio = (length + 1e-15) / (closest + 1e-9)
    return score * math.exp(1 - 1 / ratio) if ratio < 1 else score
