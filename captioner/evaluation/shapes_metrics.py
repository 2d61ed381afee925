"""Two measures for the shapes data that n-gram overlap cannot fake.

* **object precision**: of all objects named in the generated captions (a colour word followed by a shape
  word), the fraction whose (colour, shape) is in that image;
* **relation accuracy**: of all spatial relations stated between two named objects both in the image, the
  fraction that are true by the generator's rule (:func:`captioner.data.shapes.relation_of`); a relation of an
  object to itself is never true.

Captions are read leniently with the grammar of :mod:`captioner.data.shapes` (:func:`parse_caption`): unknown
words, ``<unk>`` and truncated captions are skipped over, never an error. The image objects come from the
shapes ``instances_*.json`` through :func:`shapes_objects`: per image a list of ``{"shape", "colour", "size",
"bbox"}`` dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from captioner.data.shapes import (
    COLOURS,
    RELATIONS,
    SHAPES,
    SIZES,
    bbox_centre,
    relation_of,
)
from captioner.data.text import tokenize
from captioner.errors import CaptionerError

RELATION_WORDS = {tuple(phrase.split()): phrase for phrase in RELATIONS}


@dataclass(frozen=True)
class Mention:
    """An object named in a caption: ``[size] colour shape`` (``size`` is None when not stated)."""

    colour: str
    shape: str
    size: str | None = None


@dataclass(frozen=True)
class Relation:
    """``mentions[subject_index]`` is ``relation`` (e.g. "above") ``mentions[object_index]``."""

    subject_index: int
    relation: str
    object_index: int


def _relation_at(tokens: list[str], start: int) -> str | None:
    """The relation phrase that begins at ``tokens[start]``, if any."""
    for words, phrase in RELATION_WORDS.items():
        if tuple(tokens[start : start + len(words)]) == words:
            return phrase
    return None


def parse_caption(caption: str) -> tuple[list[Mention], list[Relation]]:
    """The object mentions in ``caption`` and the relations stated between them.

    A mention is a colour word directly followed by a shape word, with the size word just before the
    colour when there is one. A relation phrase links the mention before it (in the same clause: "and"
    starts a new one) to the next mention after it. Anything else is skipped, so junk text, unknown words
    and truncated captions give whatever mentions and relations they contain; this never raises.
    """
    tokens = tokenize(caption)
    mentions: list[Mention] = []
    relations: list[Relation] = []
    subject: int | None = None     # the mention a relation phrase would attach to
    pending: str | None = None     # a relation phrase waiting for its second mention
    i = 0
    while i < len(tokens):
        phrase = _relation_at(tokens, i)
        if phrase is not None:
            pending = phrase if subject is not None else None
            i += len(phrase.split())
        elif tokens[i] in COLOURS and i + 1 < len(tokens) and tokens[i + 1] in SHAPES:
            size = tokens[i - 1] if i > 0 and tokens[i - 1] in SIZES else None
            mentions.append(Mention(tokens[i], tokens[i + 1], size))
            if pending is not None:
                relations.append(Relation(subject, pending, len(mentions) - 1))
            subject, pending = len(mentions) - 1, None
            i += 2
        else:
            if tokens[i] == "and":
                subject, pending = None, None
            i += 1
    return mentions, relations


def shapes_objects(data: object, instances_file: str | Path) -> dict[int, list[dict]]:
    """``{image_id: [{"shape", "colour", "size", "bbox"}, ...]}`` from the parsed JSON ``data`` of a shapes
    ``instances_*.json`` (``instances_file``, named in errors).

    Every image of the file has an entry (possibly empty). Returns an empty dict for a COCO instances
    file whose annotations carry no "colour" (not shapes data), so callers can skip the measures.
    Raises :class:`CaptionerError` for data that are not COCO instances.
    """
    try:
        names = {category["id"]: category["name"] for category in data.get("categories", [])}
        annotations = data["annotations"]
        if any("colour" not in annotation for annotation in annotations):
            return {}
        objects: dict[int, list[dict]] = {image["id"]: [] for image in data["images"]}
        for annotation in annotations:
            objects.setdefault(annotation["image_id"], []).append(
                {"shape": names[annotation["category_id"]], "colour": annotation["colour"],
                 "size": annotation.get("size"), "bbox": [float(v) for v in annotation["bbox"]]})
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise CaptionerError(f"{instances_file}: not a COCO instances file ({type(err).__name__}: {err})") from None
    return objects


@dataclass
class _Tally:
    """Counts over a set of captions, and the two measures they give."""

    mentions: int = 0
    mentions_present: int = 0
    relations_graded: int = 0
    relations_true: int = 0

    @property
    def object_precision(self) -> float:
        return self.mentions_present / self.mentions if self.mentions else 0.0

    @property
    def relation_accuracy(self) -> float | None:
        return self.relations_true / self.relations_graded if self.relations_graded else None


def _matching(mention: Mention, present: list[dict]) -> list[dict]:
    return [obj for obj in present if obj["colour"] == mention.colour and obj["shape"] == mention.shape]


def _holds(relation: str, subjects: list[dict], references: list[dict]) -> bool:
    """Whether ``relation`` holds between some subject and some other reference object."""
    return any(relation_of(bbox_centre(a["bbox"]), bbox_centre(b["bbox"])) == relation
               for a in subjects for b in references if a is not b)


def _tally(generated: Mapping[int, str], objects: Mapping[int, list[dict]]) -> _Tally:
    tally = _Tally()
    for image_id, caption in generated.items():
        if image_id not in objects:
            raise CaptionerError(f"shapes measures: no objects for image {image_id!r} (captions and instances "
                                 "files of different splits?)")
        mentions, relations = parse_caption(caption)
        matches = [_matching(mention, objects[image_id]) for mention in mentions]
        tally.mentions += len(mentions)
        tally.mentions_present += sum(bool(found) for found in matches)
        for rel in relations:
            subjects, references = matches[rel.subject_index], matches[rel.object_index]
            if subjects and references:
                tally.relations_graded += 1
                tally.relations_true += _holds(rel.relation, subjects, references)
    return tally


def shapes_scores(generated: Mapping[int, str], objects: Mapping[int, list[dict]]) -> dict:
    """Both measures of ``generated`` (``{image_id: caption}``) against ``objects`` (as from
    :func:`shapes_objects`), and their counts, in one pass: ``{"object_precision", "relation_accuracy",
    "relations_graded", "mentions"}``. Object precision is the fraction of object mentions whose colour and shape
    are in that image (0.0 when nothing is named at all); relation accuracy the fraction of gradable stated
    relations (both mentions name objects in the image) that are true (None when no relation is gradable)."""
    tally = _tally(generated, objects)
    return {"object_precision": tally.object_precision, "relation_accuracy": tally.relation_accuracy,
            "relations_graded": tally.relations_graded, "mentions": tally.mentions}
