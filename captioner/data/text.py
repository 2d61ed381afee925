"""The tokeniser: captions to word tokens the way the COCO caption evaluation splits them, with no downloaded data.

:func:`tokenize` is a pure-Python copy of ``pycocoevalcap``'s tokenization (Stanford CoreNLP 3.4.1's
``PTBTokenizer -preserveLines -lowerCase``, then the removal of :data:`PUNCTUATION`): nltk's
:class:`~nltk.tokenize.TreebankWordTokenizer` on each whitespace-separated chunk, plus the rules by which the Java
tokenizer differs from it (brackets kept as ``-lrb-``, ``-rrb-``...; the period of :data:`ABBREVIATIONS` kept;
quotes, clitics, ``&``, ``@``, ``#``, hyphens, ellipses and curly quotes as Java treats them). The vocabulary, the
validation score and the scores computed without Java all split captions with it.

``tests/test_ptb_tokenizer.py`` compares it with the Java tokenizer. The differences that remain are Java special
cases rare in captions: some apostrophes inside words (``y'all``, ``5'10``), currency signs other than
``$ £ € ¢``, an abbreviation glued to a number or followed by more periods, and abbreviations that are not in
:data:`ABBREVIATIONS`.
"""

from __future__ import annotations

import re
from functools import lru_cache

from pycocoevalcap.tokenizer.ptbtokenizer import PUNCTUATIONS

OPEN_WORDS = frozenset({"a", "an", "the", "of", "with", "and", "in", "on", "at", "to", "for", "from", "by", "his", "her",
                        "their", "its", "is", "are", "while", "near", "next", "into", "onto"})
"""Words an English caption cannot end on ("a", "of", "with", ...): a caption that stops on one was cut short
(the diversity measure ``dangling_end``; ``decode.no_dangling_end`` keeps ``<end>`` from following one)."""

PUNCTUATION = frozenset(PUNCTUATIONS)
"""The tokens ``pycocoevalcap`` drops after the Java tokenizer (compared after lower-casing, so the upper-case
bracket names in it never match)."""

ABBREVIATIONS = frozenset((
    "mr mrs ms dr st jr sr co cos corp inc ltd plc vs etc al cf ave blvd rd mt ft dept univ jan feb mar apr jun "
    "jul aug sep sept oct nov dec mon tue wed thu fri prof rev gen col lt capt sgt cpl maj brig adm cmdr comdr gov "
    "sen sens rep reps hon pres messrs mlle mme atty supt det insp pfc spc ens bros cie bancorp bhd assn intl sys "
    "est ext tel sq ste mfg adj natl pty pte wm calif fla ala ariz colo conn dak ga ind kan kans ky md mich minn mo "
    "mont neb nev okla penn tenn va vt wis wisc wyo ph.d").split())
"""Words (lower case) whose period the Java tokenizer keeps in any case and context: ``"mr."``, ``"st."``."""
CAPITALISED_ABBREVIATIONS = frozenset("ark del ill la miss ore tex mass wash pa".split())
"""Words whose period is kept only when they start with a capital (``"Wash."``, but ``"wash."`` ends a word)."""
NUMBER_ABBREVIATIONS = frozenset("no nos fig figs pp ca op".split())
"""Words whose period is kept only before a number: ``"no. 5"``."""

_CHARACTERS = str.maketrans({"‘": "'", "’": "'", "‛": "'", "“": '"', "”": '"', "«": '"', "»": '"', "`": " ` ",
                             "—": " -- ", "–": " -- ", "…": " ... ", "½": " 1/2 ", "¼": " 1/4 ", "¾": " 3/4 ",
                             "£": " # ", "€": " $ ", "¢": " cents ", "\u200b": " "})
_ENTITIES = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}
_ENTITY = re.compile(r"&(amp|lt|gt|quot|apos);")
_ELLIPSIS_OR_DASH = re.compile(r"(\.)\.+|(-)-+")
_SEPARATE = re.compile(r"[*+=~^|]|(?<!\S)-(?=[^\W\d_])|(?<=\S)-(?!\S)")
_KEPT_WHOLE = re.compile(r"[A-Z]+&[A-Z]+|[!?]{2,}|'[nN]'|</?[A-Za-z]\w*>|[\w.+-]*@\w+(?:[.-]\w+)*"
                         r"|#[^\W\d_]+")
_LEADING_CLITIC = re.compile(r"'(?:(?:[sdm]|re|ve|ll|em|n|til|cause)(?![^\W_])|tis|twas|\d)", re.IGNORECASE)
_ABBREVIATION = re.compile(r"(?:^|(?<=[(\[{\"]))([^\W\d_]+(?:\.[^\W\d_]+)*)\.(?=[)\]}\"']*$)")
_INITIALS = re.compile(r"[^\W\d_](?:\.[^\W\d_])*")
_DIGIT_START = re.compile(r"\W*\d")


def tokenize(text: str) -> list[str]:
    """``text`` as the COCO evaluation's PTB tokenizer splits it, lower-cased and without punctuation:
    ``"A dog's ball (red)."`` -> ``["a", "dog", "'s", "ball", "-lrb-", "red", "-rrb-"]``."""
    text = _ENTITY.sub(lambda match: _ENTITIES[match[1]], text).translate(_CHARACTERS)
    text = _ELLIPSIS_OR_DASH.sub(lambda match: " ... " if match[1] else " -- ", text)
    chunks = _SEPARATE.sub(lambda match: f" {match[0]} ", text).split()
    tokens = []
    for k, chunk in enumerate(chunks):
        before_number = k + 1 < len(chunks) and _DIGIT_START.match(chunks[k + 1]) is not None
        tokens.extend(_chunk_tokens(chunk, before_number))
    return tokens


def has_words(text: str) -> bool:
    """Whether ``text`` holds a letter or digit (a caption without one says nothing)."""
    return any(character.isalnum() for character in text)


@lru_cache(maxsize=1 << 16)
def _chunk_tokens(chunk: str, before_number: bool) -> tuple[str, ...]:
    """The lower-cased tokens of one whitespace-free ``chunk``, punctuation removed (cached: chunks repeat)."""
    kept = [match.span() for match in _KEPT_WHOLE.finditer(chunk)]
    abbreviation = _ABBREVIATION.search(chunk)      # letters and periods: never inside a kept span
    if abbreviation is not None and _is_abbreviation(abbreviation[1], before_number):
        kept = sorted(kept + [abbreviation.span()])
    pieces, start = [], 0
    for kept_start, kept_end in kept:
        pieces += _piece_tokens(chunk[start:kept_start]) + [chunk[kept_start:kept_end]]
        start = kept_end
    pieces += _piece_tokens(chunk[start:])
    return tuple(token for token in (piece.lower() for piece in pieces) if token not in PUNCTUATION)


@lru_cache(maxsize=1)
def _treebank():
    """nltk's Treebank tokenizer, imported at the first caption tokenized: importing nltk (scipy.stats with it) is
    slow, and commands that never tokenize (caption, serve, export, config) do not pay for it."""
    from nltk.tokenize import TreebankWordTokenizer
    return TreebankWordTokenizer()


def _piece_tokens(piece: str) -> list[str]:
    """nltk's Treebank tokens of ``piece`` (part of a chunk), with a quote that opens a word split off."""
    if not piece:
        return []
    if piece.startswith("'") and not piece.startswith("''") and not _LEADING_CLITIC.match(piece):
        return ["'"] + _treebank().tokenize(piece[1:], convert_parentheses=True)
    return _treebank().tokenize(piece, convert_parentheses=True)


def _is_abbreviation(word: str, before_number: bool) -> bool:
    """Whether the Java tokenizer keeps the period after ``word``."""
    lower = word.lower()
    return (_INITIALS.fullmatch(word) is not None or lower in ABBREVIATIONS
            or (lower in CAPITALISED_ABBREVIATIONS and word[0].isupper())
            or (lower in NUMBER_ABBREVIATIONS and before_number))
