"""Two measures for the shapes data that n-gram overlap cannot fake.

* object precision: of all objects named in generated captions (colour and shape), the fraction that
  exist in the image;
* relation accuracy: of all spatial relations stated between two named objects that exist, the
  fraction that are true (same rule as the generator: the stated direction must hold along the axis of
  larger centre separation).

Captions are parsed with the grammar of :mod:`captioner.data.shapes`, leniently: unknown words, ``<unk>``
and truncated captions are skipped over, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from captioner.data.readers import read_json
from captioner.data.shapes import COLOURS, SHAPES, SIZES, relation_between
from captioner.data.vocabulary import tokenize

RELATION_PHRASES = {("to", "the", "left", "of"): "to the left of", ("to", "the", "right", "of"): "to the right of",
                    ("above",): "above", ("below",): "below"}


@dataclass(frozen=True)
class Mention:
    colour: str
    shape: str
    size: str | None = None
    position: int = 0  # index of the shape word among the caption's tokens


@dataclass(frozen=True)
class Relation:
    subject: int   # index into the mentions
    relation: str
    object: int


def parse_caption(caption: str) -> tuple[list[Mention], list[Relation]]:
    """Mentions (``[size] colour shape``) and the relations stated between consecutive mentions."""
    tokens = tokenize(caption)
    mentions: list[Mention] = []
    relations: list[Relation] = []
    pending: str | None = None
    i = 0
    while i < len(tokens):
        phrase = next((rel for words, rel in RELATION_PHRASES.items() if tuple(tokens[i : i + len(words)]) == words), None)
        if phrase is not None:
            pending = phrase if mentions else None
            i += len(phrase.split())
            continue
        if tokens[i] in COLOURS and i + 1 < len(tokens) and tokens[i + 1] in SHAPES:
            size = tokens[i - 1] if i > 0 and tokens[i - 1] in SIZES else None
            mentions.append(Mention(tokens[i], tokens[i + 1], size, i + 1))
            if pending is not None:
                relations.append(Relation(len(mentions) - 2, pending, len(mentions) - 1))
            pending = None
            i += 2
            continue
        if tokens[i] == "and":
            pending = None
        i += 1
    return mentions, relations


def load_shapes_objects(instances_file: str | Path) -> dict[int, list[dict]]:
    """``{image_id: [{"shape", "colour", "size", "bbox"}]}`` from a shapes ``instances_*.json``.

    Returns an empty dict for COCO instance files without colour attributes (not shapes data).
    """
    data = read_json(instances_file)
    names = {c["id"]: c["name"] for c in data.get("categories", [])}
    objects: dict[int, list[dict]] = {image["id"]: [] for image in data.get("images", [])}
    for ann in data.get("annotations", []):
        if "colour" not in ann:
            return {}
        objects.setdefault(ann["image_id"], []).append(
            {"shape": names[ann["category_id"]], "colour": ann["colour"], "size": ann.get("size"), "bbox": ann["bbox"]})
    return objects


def _find(mention: Mention, objects: list[dict]) -> dict | None:
    return next((o for o in objects if o["colour"] == mention.colour and o["shape"] == mention.shape), None)


def _centre(obj: dict) -> tuple[float, float]:
    x, y, w, h = obj["bbox"]
    return x + w / 2, y + h / 2


def shapes_scores(generated: Mapping[int, str], objects: Mapping[int, list[dict]]) -> dict:
    """``object_precision``, ``relation_accuracy`` (None when nothing was gradable) and the counts."""
    mentions_total = mentions_right = graded = right = 0
    for image_id, caption in generated.items():
        present = objects.get(image_id, [])
        mentions, relations = parse_caption(caption)
        found = [_find(m, present) for m in mentions]
        mentions_total += len(mentions)
        mentions_right += sum(f is not None for f in found)
        for rel in relations:
            a, b = found[rel.subject], found[rel.object]
            if a is None or b is None or a is b:
                continue
            graded += 1
            right += relation_between(_centre(a), _centre(b)) == rel.relation
    return {"object_precision": mentions_right / mentions_total if mentions_total else None,
            "relation_accuracy": right / graded if graded else None,
            "mentions": mentions_total, "relations_graded": graded}
