"""Attention grounding: does the model look at the object it names?

Every generated word that names an object in the image (a :class:`Target`) is judged on the attention map of
the step that emitted it: on the shapes data, a mention naming exactly one object (its box); on COCO, a word
or phrase of :data:`captioner.evaluation.coco_words.CATEGORY_WORDS` (the category's instance masks, or boxes).

Measures, per word, per category and overall: **pointing accuracy** (the upsampled map's maximum falls on the
object, or within half a grid cell of its box; ties are broken at random in expectation, so a flat map scores
the uniform baseline) and **attention inside** (``sum_i alpha_i * (fraction of cell i covered by the object)``),
with a **uniform** and a **centre** baseline under the same rules. Hard attention is judged on its chosen
locations (map ``"chosen"``), the other decoders on ``"alpha"`` (the Transformer's head-averaged
cross-attention).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from captioner.core.files import read_json
from captioner.data.readers import coco_api
from captioner.data.shapes import COLOURS, SHAPES
from captioner.decoding.search import Generation
from captioner.errors import CaptionerError
from captioner.evaluation.coco_words import phrase_categories
from captioner.evaluation.shapes_metrics import shapes_objects


@dataclass
class Target:
    """What one generated word names: its category, its box ``[x, y, w, h]`` in image pixels (on COCO the
    union of the category's instance boxes, each of which is kept in ``instance_boxes`` for drawing) and,
    where known, its pixel mask ``(H, W)`` bool at image size, which then replaces the box in the measures."""

    category: str
    box: list[float]
    mask: np.ndarray | None = None
    instance_boxes: list[list[float]] | None = None

    def cell_fractions(self, grid: tuple[int, int], image_size: tuple[int, int]) -> np.ndarray:
        """Fraction of each cell covered by the object, ``(gh, gw)``, for an image of ``(width, height)``."""
        if self.mask is None:
            return cell_overlap(self.box, grid, image_size)
        (gh, gw), (height, width) = grid, self.mask.shape
        rows = (np.arange(height) + 0.5) * gh // height   # the cell row of each pixel centre
        cols = (np.arange(width) + 0.5) * gw // width
        cells = (rows[:, None] * gw + cols[None, :]).astype(int).ravel()
        covered = np.bincount(cells, weights=self.mask.ravel().astype(float), minlength=gh * gw)
        return (covered / np.bincount(cells, minlength=gh * gw)).reshape(gh, gw)

    def near_centre(self, grid: tuple[int, int], image_size: tuple[int, int]) -> bool:
        """Whether a point at the image centre counts as on the object (the centre baseline)."""
        (gh, gw), (width, height) = grid, image_size
        cell_w, cell_h = width / gw, height / gh
        if self.mask is None:
            x, y, w, h = self.box
            return x - cell_w / 2 < width / 2 < x + w + cell_w / 2 and y - cell_h / 2 < height / 2 < y + h + cell_h / 2
        mask_h, mask_w = self.mask.shape
        near_x = np.abs((np.arange(mask_w) + 0.5) * width / mask_w - width / 2) < cell_w / 2
        near_y = np.abs((np.arange(mask_h) + 0.5) * height / mask_h - height / 2) < cell_h / 2
        return bool(self.mask[np.ix_(near_y, near_x)].any())


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


def ground_map(attention: np.ndarray, target: Target, image_size: tuple[int, int]) -> tuple[float, float]:
    """``(hit, inside)`` of one attention map ``(gh, gw)`` against ``target``: whether its peak cell overlaps
    the object, and its mass on the object. Where several cells tie for the peak (a flat map: the ``none``
    ablation), ``hit`` is the fraction of them that overlap, the expected hit of a random tie-break."""
    overlap = target.cell_fractions(attention.shape, image_size)
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


class ShapesTargets:
    """Targets on the shapes data: ``objects`` as from :func:`~captioner.evaluation.shapes_metrics.shapes_objects`."""

    def __init__(self, objects: Mapping[int, list[dict]]):
        self.objects = objects

    def __contains__(self, image_id: int) -> bool:
        return image_id in self.objects

    def named(self, image_id: int, words: list[str]) -> list[tuple[int, Target]]:
        return [(i, Target(o["shape"], o["bbox"])) for i, o in named_objects(words, self.objects[image_id])]


class CocoTargets:
    """Targets on COCO: category words of ``instances_file`` (a COCO ``instances_*.json``), grounded in
    the union of the category's instance masks in each image."""

    def __init__(self, instances_file: str | Path, dataset: dict | None = None):
        """``dataset``: the file's parsed JSON, when the caller has it already (the file is not read again)."""
        self.file = instances_file
        self.coco = coco_api(instances_file, dataset)
        try:
            self.category_ids = {c["name"]: c["id"] for c in self.coco.loadCats(self.coco.getCatIds())}
        except KeyError as err:      # a captions file, say: no 'categories'
            raise CaptionerError(f"{instances_file}: not a COCO instances file (no {err})") from None
        self._cache: dict[tuple[int, str], Target] = {}

    def __contains__(self, image_id: int) -> bool:
        return image_id in self.coco.imgs

    def target(self, image_id: int, category: str) -> Target | None:
        """The union of ``category``'s instances in the image, or None when it has none."""
        key = (image_id, category)
        if key not in self._cache:
            category_id = self.category_ids.get(category)
            ids = self.coco.getAnnIds(imgIds=[image_id], catIds=[category_id]) if category_id is not None else []
            annotations = self.coco.loadAnns(ids)
            if not annotations:
                return None
            boxes = np.array([a["bbox"] for a in annotations], dtype=float)
            x0, y0 = boxes[:, 0].min(), boxes[:, 1].min()
            box = [x0, y0, (boxes[:, 0] + boxes[:, 2]).max() - x0, (boxes[:, 1] + boxes[:, 3]).max() - y0]
            mask = None
            if all(a.get("segmentation") for a in annotations):
                try:
                    with warnings.catch_warnings():  # pycocotools' numpy-2 copy-keyword deprecation
                        warnings.simplefilter("ignore", DeprecationWarning)
                        mask = np.any([self.coco.annToMask(a) > 0 for a in annotations], axis=0)
                except (KeyError, TypeError, ValueError, IndexError) as err:
                    raise CaptionerError(f"{self.file}: image {image_id}: unreadable segmentation ({err})") from None
            self._cache[key] = Target(category, box, mask, [[float(v) for v in b] for b in boxes])
        return self._cache[key]

    def named(self, image_id: int, words: list[str]) -> list[tuple[int, Target]]:
        found = []
        for position, category in phrase_categories(words):
            target = self.target(image_id, category)
            if target is not None:
                found.append((position, target))
        return found


def load_targets(instances_file: str | Path) -> ShapesTargets | CocoTargets | None:
    """The targets of an instances file: shapes objects when its annotations carry colours, else COCO
    categories; None when no file is named. A named file that is not there is a
    :class:`~captioner.errors.CaptionerError`."""
    return load_instances(instances_file)[0]


def load_instances(instances_file: str | Path) -> tuple[ShapesTargets | CocoTargets | None, dict[int, tuple[int, int]]]:
    """``(load_targets(instances_file), {image_id: (width, height)})``, the file parsed once; ``(None, {})``
    when no file is named."""
    if not instances_file:
        return None, {}
    if not Path(instances_file).is_file():
        raise CaptionerError(f"{instances_file}: instances file not found (data.instances)")
    data = read_json(instances_file)
    objects = shapes_objects(data, instances_file)
    targets = ShapesTargets(objects) if objects else CocoTargets(instances_file, data)
    return targets, _image_sizes(data, instances_file)


@dataclass
class _Counts:
    words: int = 0
    hits: float = 0.0
    inside: float = 0.0
    uniform_hits: float = 0.0
    uniform_inside: float = 0.0
    centre_hits: float = 0.0

    def add(self, hit: float, inside: float, uniform_hit: float, uniform_inside: float, centre_hit: bool) -> None:
        self.words += 1
        self.hits += hit
        self.inside += inside
        self.uniform_hits += uniform_hit
        self.uniform_inside += uniform_inside
        self.centre_hits += centre_hit

    def summary(self) -> dict:
        n = max(self.words, 1)
        return {"words": self.words, "pointing_accuracy": self.hits / n, "attention_inside": self.inside / n,
                "uniform_pointing": self.uniform_hits / n, "uniform_inside": self.uniform_inside / n,
                "centre_pointing": self.centre_hits / n}


def ground(generations: Mapping[int, Generation] | Iterable[tuple[int, Generation]], vocab,
           targets: ShapesTargets | CocoTargets, image_sizes: Mapping[int, tuple[int, int]],
           grid: tuple[int, int]) -> dict | None:
    """Grounding of ``generations`` (``{image_id: Generation}``, or ``(image_id, Generation)`` pairs for several
    captions per image) against ``targets``, for images of ``image_sizes`` ``{image_id: (width, height)}`` seen
    through a ``grid = (gh, gw)`` of regions.

    Returns the overall measures (those of the module docstring, ``words``, ``map``, ``images_grounded`` and
    ``images_without_objects``: images the instances file lacks) with ``per_word`` and ``per_category``, or None
    when the decoder reports no attention maps. Raises :class:`CaptionerError` when no image is in the file.
    """
    total, per_word, per_category = _Counts(), {}, {}
    map_name, absent = None, []
    pairs = list(generations.items() if isinstance(generations, Mapping) else generations)
    for image_id, generation in pairs:
        if not generation.attention:
            return None
        map_name = "chosen" if "chosen" in generation.attention else "alpha"
        if image_id not in targets or image_id not in image_sizes:
            absent.append(image_id)
            continue
        size = image_sizes[image_id]
        maps = generation.attention[map_name].float().reshape(-1, *grid).cpu().numpy()
        words = vocab.decode_tokens(generation.tokens)
        for position, target in targets.named(image_id, words):
            hit, inside = ground_map(maps[position], target, size)
            overlap = target.cell_fractions(grid, size)
            counts = (hit, inside, float((overlap > 0).mean()), float(overlap.mean()), target.near_centre(grid, size))
            total.add(*counts)
            per_word.setdefault(words[position], _Counts()).add(*counts)
            per_category.setdefault(target.category, _Counts()).add(*counts)
    if map_name is None:
        return None
    if absent and len(absent) == len(pairs):
        raise CaptionerError(f"grounding: none of the {len(absent)} images is in the instances file (e.g. image "
                             f"{absent[0]!r}): captions and instances files of different splits?")
    images, without = {i for i, _ in pairs}, set(absent)
    return {**total.summary(), "map": map_name, "images_grounded": len(images - without),
            "images_without_objects": len(without),
            "per_word": {word: counts.summary() for word, counts in sorted(per_word.items())},
            "per_category": {name: counts.summary() for name, counts in sorted(per_category.items())}}


def boxes_of_named_objects(instances_file: str | Path, image_path: str | Path, words: list[str]) -> list[list[list[float]]]:
    """For each of ``words`` (a caption of the image at ``image_path``), the boxes ``[x, y, w, h]`` of the
    object it names in ``instances_file`` (empty for other words); the image is found by file name."""
    name = Path(image_path).name
    matches = [image["id"] for image in read_json(instances_file).get("images", [])
               if Path(str(image.get("file_name", ""))).name == name]
    if not matches:
        raise CaptionerError(f"{instances_file}: no image named {name!r}")
    boxes: list[list[list[float]]] = [[] for _ in words]
    for position, target in load_targets(instances_file).named(matches[0], list(words)):
        boxes[position].extend(target.instance_boxes or [target.box])
    return boxes


def _image_sizes(data: dict, instances_file: str | Path) -> dict[int, tuple[int, int]]:
    """``{image_id: (width, height)}`` of a COCO instances (or captions) file's parsed JSON (``instances_file``,
    named in errors)."""
    try:
        return {image["id"]: (int(image["width"]), int(image["height"])) for image in data.get("images", [])}
    except (KeyError, TypeError, ValueError) as err:
        raise CaptionerError(f"{instances_file}: an image without its size ({type(err).__name__}: {err})") from None


def format_grounding(grounding: dict) -> str:
    """A short table: one row overall, then one per category, model against the two baselines (on COCO,
    where several words name one category, the per-word rows follow)."""
    head = f"{'':<16}{'words':>7}{'pointing':>10}{'inside':>8}{'uniform pt':>12}{'uniform in':>12}{'centre pt':>11}"
    sections = [("category", grounding["per_category"])]
    if set(grounding["per_word"]) != set(grounding["per_category"]):
        sections.append(("word", grounding["per_word"]))
    lines = [f"grounding on '{grounding['map']}' maps", head]
    for title, rows in [("all", {"all": grounding})] + sections:
        if title != "all":
            lines.append(f"per {title}:")
        for name, g in rows.items():
            lines.append(f"{name:<16}{g['words']:>7}{g['pointing_accuracy']:>10.3f}{g['attention_inside']:>8.3f}"
                         f"{g['uniform_pointing']:>12.3f}{g['uniform_inside']:>12.3f}{g['centre_pointing']:>11.3f}")
    return "\n".join(lines)
