"""Attention grounding on the shapes data: does the model look at the object it names?

For every generated shape word whose mention (colour and shape, see
:func:`captioner.evaluation.shapes_metrics.parse_caption`) names exactly one object of the image, the
attention map of the step that emitted the word is compared with that object's box:

* **pointing accuracy** (the pointing game): the map's maximum falls on the object (ties between equal
  peaks are broken at random, in expectation, so a flat map scores the uniform baseline). The encoder sees the
  whole image resized, so grid cell ``(r, c)`` of a ``gh x gw`` grid covers the image rectangle
  ``[c W/gw, (c+1) W/gw) x [r H/gh, (r+1) H/gh)``. Upsampled bilinearly, a map peaks at the centre of its
  largest cell; the point counts as on the object when it lies within the box widened by half a cell on
  every side, i.e. when the peak cell overlaps the box (the tolerance a grid of this coarseness allows);
* **attention mass in the box**: ``sum_i alpha_i * (fraction of cell i inside the box)``.

Two baselines get the same rule: **uniform** attention (pointing = the chance that a random cell
overlaps the box, mass = the box's share of the image) and a **centre** guess (a point at the image
centre). Hard attention is judged on its chosen locations (map ``"chosen"``), the other decoders on
``"alpha"`` (the Transformer's head-averaged cross-attention). Words naming nothing in the image, or an
object that appears twice, are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from captioner.data.shapes import COLOURS, SHAPES
from captioner.decoding.search import Generation
from captioner.errors import CaptionerError


def cell_overlap(box: list[float], grid: tuple[int, int], image_size: tuple[int, int]) -> np.ndarray:
    """Fraction of each cell's area inside ``box`` (COCO ``[x, y, w, h]`` in pixels), ``(gh, gw)``, for an
    image of ``image_size = (width, height)``."""
    (gh, gw), (width, height) = grid, image_size
    x, y, w, h = box

    def overlap_1d(start: float, end: float, cells: int, extent: float) -> np.ndarray:
        edges = np.arange(cells + 1) * extent / cells
        inside = np.clip(np.minimum(edges[1:], end) - np.maximum(edges[:-1], start), 0, None)
        return inside / (extent / cells)

    return np.outer(overlap_1d(y, y + h, gh, height), overlap_1d(x, x + w, gw, width))


def point_on_box(point: tuple[float, float], box: list[float], cell_size: tuple[float, float]) -> bool:
    """Whether ``(x, y)`` lies in ``box`` widened by half a cell (``cell_size = (width, height)``) each side."""
    x, y, w, h = box
    half_w, half_h = cell_size[0] / 2, cell_size[1] / 2
    return x - half_w < point[0] < x + w + half_w and y - half_h < point[1] < y + h + half_h


def ground_map(attention: np.ndarray, box: list[float], image_size: tuple[int, int]) -> tuple[float, float]:
    """``(hit, mass)`` of one attention map ``(gh, gw)`` against ``box``: whether its peak cell overlaps the
    box, and its mass inside the box. Where several cells tie for the peak (a flat map: the ``none``
    ablation), ``hit`` is the fraction of them that overlap, the expected hit of a random tie-break."""
    overlap = cell_overlap(box, attention.shape, image_size)
    peaks = np.isclose(attention, attention.max(), rtol=1e-5, atol=0.0)
    return float((overlap[peaks] > 0).mean()), float((attention * overlap).sum())


def named_objects(words: list[str], objects: list[dict]) -> list[tuple[int, dict]]:
    """``(position, object)`` for every shape word in ``words`` that, with the colour word before it,
    names exactly one object of ``objects`` (``{"shape", "colour", "bbox"}`` dicts)."""
    found = []
    for i in range(1, len(words)):
        if words[i] in SHAPES and words[i - 1] in COLOURS:
            matches = [o for o in objects if o["shape"] == words[i] and o["colour"] == words[i - 1]]
            if len(matches) == 1:
                found.append((i, matches[0]))
    return found


@dataclass
class _Counts:
    words: int = 0
    hits: float = 0.0
    mass: float = 0.0
    uniform_hits: float = 0.0
    uniform_mass: float = 0.0
    centre_hits: float = 0.0

    def add(self, hit: float, mass: float, uniform_hit: float, uniform_mass: float, centre_hit: bool) -> None:
        self.words += 1
        self.hits += hit
        self.mass += mass
        self.uniform_hits += uniform_hit
        self.uniform_mass += uniform_mass
        self.centre_hits += centre_hit

    def summary(self) -> dict:
        n = max(self.words, 1)
        return {"words": self.words, "pointing_accuracy": self.hits / n, "attention_in_box": self.mass / n,
                "uniform_pointing": self.uniform_hits / n, "uniform_in_box": self.uniform_mass / n,
                "centre_pointing": self.centre_hits / n}


def shapes_grounding(generations: Mapping[int, Generation], vocab, objects: Mapping[int, list[dict]],
                     image_sizes: Mapping[int, tuple[int, int]], grid: tuple[int, int]) -> dict | None:
    """Grounding of ``generations`` (``{image_id: Generation}``) against the shapes ``objects``
    (:func:`~captioner.evaluation.shapes_metrics.load_shapes_objects`), images of ``image_sizes``
    ``{image_id: (width, height)}`` seen through a ``grid = (gh, gw)`` of regions.

    Returns the overall measures (keys of the module docstring, plus ``words`` counted and ``map`` used)
    with a ``per_word`` breakdown by shape word, or None when the decoder reports no attention maps.
    """
    total, per_word = _Counts(), {}
    map_name = None
    for image_id, generation in generations.items():
        if not generation.attention:
            return None
        map_name = "chosen" if "chosen" in generation.attention else "alpha"
        if image_id not in objects or image_id not in image_sizes:
            raise CaptionerError(f"grounding: no objects for image {image_id!r} (captions and instances files "
                                 "of different splits?)")
        size = image_sizes[image_id]
        cell = (size[0] / grid[1], size[1] / grid[0])
        maps = generation.attention[map_name].float().reshape(-1, *grid).cpu().numpy()
        words = vocab.decode_tokens(generation.tokens)
        for position, obj in named_objects(words, objects[image_id]):
            hit, mass = ground_map(maps[position], obj["bbox"], size)
            overlap = cell_overlap(obj["bbox"], grid, size)
            counts = ((hit, mass, float((overlap > 0).mean()), float(overlap.mean()),
                       point_on_box((size[0] / 2, size[1] / 2), obj["bbox"], cell)))
            total.add(*counts)
            per_word.setdefault(words[position], _Counts()).add(*counts)
    if map_name is None:
        return None
    return {**total.summary(), "map": map_name,
            "per_word": {word: counts.summary() for word, counts in sorted(per_word.items())}}


def load_image_sizes(instances: dict) -> dict[int, tuple[int, int]]:
    """``{image_id: (width, height)}`` from a COCO instances (or captions) dict."""
    return {image["id"]: (int(image["width"]), int(image["height"])) for image in instances.get("images", [])}


def format_grounding(grounding: dict) -> str:
    """A short table: one row overall, one per word, model against the two baselines."""
    head = f"{'word':<12}{'words':>7}{'pointing':>10}{'in box':>9}{'uniform pt':>12}{'uniform box':>13}{'centre pt':>11}"
    rows = [("all", grounding)] + list(grounding["per_word"].items())
    lines = [f"grounding on '{grounding['map']}' maps", head]
    for name, g in rows:
        lines.append(f"{name:<12}{g['words']:>7}{g['pointing_accuracy']:>10.3f}{g['attention_in_box']:>9.3f}"
                     f"{g['uniform_pointing']:>12.3f}{g['uniform_in_box']:>13.3f}{g['centre_pointing']:>11.3f}")
    return "\n".join(lines)
