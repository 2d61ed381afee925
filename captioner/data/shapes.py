"""The embedded default dataset: synthetic scenes of coloured shapes with spatial-relation captions.

:func:`generate_shapes` writes real PNG files and COCO-format annotations, so the whole pipeline runs on it
unchanged::

    out_dir/images/{train,val,test}/{image_id:06d}.png
    out_dir/annotations/captions_{split}.json     COCO captions: five per image
    out_dir/annotations/instances_{split}.json    COCO instances: category (the shape word), bbox,
                                                   polygon, plus "colour" and "size" per object

A scene holds 1-3 objects (:data:`SHAPES`, :data:`COLOURS`, :data:`SIZES`), no two of the same colour and
shape, none touching, on a noisy background. Captions ("a small red circle to the left of an orange cross")
follow a small grammar that :mod:`captioner.evaluation.shapes_metrics` parses back: they name every object and
state a relation only where it is unambiguous (:func:`is_unambiguous`), along the axis of larger separation
(:func:`relation_of`; image y points down). Output is deterministic for a seed, whatever the processing order.
"""

from __future__ import annotations

import colorsys
import itertools
import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from captioner.core.devices import usable_cores
from captioner.errors import CaptionerError

SHAPES = ("circle", "square", "triangle", "diamond", "cross")
COLOURS = ("red", "green", "blue", "yellow", "purple", "orange")
SIZES = ("small", "large")
RELATIONS = ("to the left of", "to the right of", "above", "below")

COLOUR_RGB = {"red": (220, 35, 35), "green": (35, 175, 55), "blue": (40, 85, 235),
              "yellow": (240, 220, 35), "purple": (150, 55, 205), "orange": (250, 135, 15)}
COLOUR_JITTER = 12                             # per-channel jitter of an object's fill, +-
OBJECT_COUNT_PROBABILITIES = (0.2, 0.4, 0.4)   # of 1, 2, 3 objects
CAPTIONS_PER_IMAGE = 5
SPLITS = ("train", "val", "test")
FORMAT_VERSION = 2                             # written to ``info``; bump when the output changes
# ``info["description"]`` of every annotation file: what tells an earlier shapes dataset from other files
DESCRIPTION = "captioner synthetic shapes: coloured shapes with spatial-relation captions"

REFERENCE_SIZE = 128                           # the image size the pixel constants below are given for
EXTENT_RANGE = {"small": (18.0, 25.0), "large": (33.0, 44.0)}   # side of an object's bounding box, px
OBJECT_GAP = 4.0                               # least gap between two objects' boxes, px
BORDER = 2.0                                   # least gap between an object's box and the image edge, px
MIN_IMAGE_SIZE = 32
LAYOUT_ATTEMPTS = 40                           # position draws per scene before settling for fewer relations


@dataclass(frozen=True)
class SceneObject:
    """One drawn object: its words and its bounding box (a square of side ``extent`` centred on cx, cy)."""

    shape: str
    colour: str
    size: str
    cx: float
    cy: float
    extent: float

    @property
    def centre(self) -> tuple[float, float]:
        return self.cx, self.cy

    @property
    def bbox(self) -> tuple[float, float, float, float]:
        """``(x, y, width, height)`` in pixels, COCO order."""
        half = self.extent / 2
        return self.cx - half, self.cy - half, self.extent, self.extent


def bbox_centre(bbox: tuple[float, float, float, float] | list[float]) -> tuple[float, float]:
    """Centre of a COCO ``[x, y, width, height]`` box: the point relations are judged from."""
    x, y, width, height = bbox
    return x + width / 2, y + height / 2


def relation_of(subject: tuple[float, float], reference: tuple[float, float]) -> str:
    """Where ``subject`` lies relative to ``reference`` (centres), along the axis of larger separation.

    Image y points down: a subject with a smaller y is "above". A tie goes to the horizontal axis.
    """
    dx, dy = subject[0] - reference[0], subject[1] - reference[1]
    if abs(dx) >= abs(dy):
        return "to the left of" if dx < 0 else "to the right of"
    return "above" if dy < 0 else "below"


def is_unambiguous(a: tuple[float, float], b: tuple[float, float], image_size: float) -> bool:
    """Whether the relation between centres ``a`` and ``b`` is clear enough to state in a caption.

    The separation along the major axis must be at least twice that along the minor axis and at least a
    quarter of the image size.
    """
    dx, dy = abs(a[0] - b[0]), abs(a[1] - b[1])
    major, minor = max(dx, dy), min(dx, dy)
    return major >= 2 * minor and major >= 0.25 * image_size


def outline(obj: SceneObject) -> list[tuple[float, float]]:
    """The outline of ``obj`` as a polygon in pixel coordinates, filling its bounding box.

    It is both what is drawn (all shapes but the circle, drawn as an ellipse) and the COCO segmentation.
    """
    r, cx, cy = obj.extent / 2, obj.cx, obj.cy
    if obj.shape == "circle":
        steps = 32
        return [(cx + r * math.cos(2 * math.pi * k / steps), cy + r * math.sin(2 * math.pi * k / steps))
                for k in range(steps)]
    if obj.shape == "square":
        return [(cx - r, cy - r), (cx + r, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if obj.shape == "triangle":
        return [(cx, cy - r), (cx + r, cy + r), (cx - r, cy + r)]
    if obj.shape == "diamond":
        return [(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)]
    if obj.shape == "cross":
        t = r / 3  # half-width of each arm of the plus sign
        return [(cx - t, cy - r), (cx + t, cy - r), (cx + t, cy - t), (cx + r, cy - t), (cx + r, cy + t),
                (cx + t, cy + t), (cx + t, cy + r), (cx - t, cy + r), (cx - t, cy + t), (cx - r, cy + t),
                (cx - r, cy - t), (cx - t, cy - t)]
    raise ValueError(f"unknown shape {obj.shape!r}")


def polygon_area(points: list[tuple[float, float]]) -> float:
    """Area enclosed by a simple polygon (shoelace formula)."""
    return 0.5 * abs(sum(x0 * y1 - x1 * y0 for (x0, y0), (x1, y1) in zip(points, points[1:] + points[:1])))


# ---------------------------------------------------------------------------------------------- layout


def _boxes_apart(a: SceneObject, b: SceneObject, gap: float) -> bool:
    """Whether the boxes of ``a`` and ``b`` are at least ``gap`` apart along some axis."""
    reach = (a.extent + b.extent) / 2 + gap
    return abs(a.cx - b.cx) >= reach or abs(a.cy - b.cy) >= reach


def related_pairs(objects: list[SceneObject], image_size: int) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j``, whose relation is unambiguous and so may be stated."""
    return [(i, j) for i, j in itertools.combinations(range(len(objects)), 2)
            if is_unambiguous(objects[i].centre, objects[j].centre, image_size)]


def _place(rng: np.random.Generator, kinds: list[tuple[str, str, str]], image_size: int) -> list[SceneObject] | None:
    """Positions for objects of the given (shape, colour, size), or None when no usable layout was drawn.

    A layout is usable when no two boxes come closer than the gap and, with two or more objects, at least
    one pair is unambiguously related. The first layout relating every pair wins; failing that, the one
    relating the most pairs (ties to the earliest).
    """
    scale = image_size / REFERENCE_SIZE
    # Extents in half pixels and centres in quarter pixels keep every box coordinate exact in the JSON.
    extents = [round(rng.uniform(*EXTENT_RANGE[size]) * scale * 2) / 2 for _, _, size in kinds]
    all_pairs = len(kinds) * (len(kinds) - 1) // 2
    best, best_related = None, 0
    for _ in range(LAYOUT_ATTEMPTS):
        objects = []
        for (shape, colour, size), extent in zip(kinds, extents):
            low, high = extent / 2 + BORDER * scale, image_size - extent / 2 - BORDER * scale
            cx, cy = (round(v * 4) / 4 for v in rng.uniform(low, high, size=2).tolist())
            objects.append(SceneObject(shape, colour, size, cx, cy, extent))
        if not all(_boxes_apart(a, b, OBJECT_GAP * scale) for a, b in itertools.combinations(objects, 2)):
            continue
        related = len(related_pairs(objects, image_size))
        if related == all_pairs:
            return objects
        if related > best_related:
            best, best_related = objects, related
    return best


def sample_objects(rng: np.random.Generator, image_size: int) -> list[SceneObject]:
    """1-3 objects (see :data:`OBJECT_COUNT_PROBABILITIES`) of distinct (colour, shape), laid out.

    If no usable layout is drawn for the sampled count (practically never at the default size), the last
    object is dropped and the rest laid out again; a single object always fits.
    """
    count = int(rng.choice(len(OBJECT_COUNT_PROBABILITIES), p=OBJECT_COUNT_PROBABILITIES)) + 1
    combos = rng.choice(len(SHAPES) * len(COLOURS), size=count, replace=False)
    kinds = [(SHAPES[int(c) % len(SHAPES)], COLOURS[int(c) // len(SHAPES)], SIZES[int(rng.integers(len(SIZES)))])
             for c in combos]
    while True:
        objects = _place(rng, kinds, image_size)
        if objects is not None:
            return objects
        kinds = kinds[:-1]


# -------------------------------------------------------------------------------------------- captions


def _mention(obj: SceneObject, definite: bool, with_size: bool) -> str:
    """``"a small red circle"``, ``"an orange square"``, ``"the blue cross"``..."""
    words = f"{obj.size} {obj.colour} {obj.shape}" if with_size else f"{obj.colour} {obj.shape}"
    article = "the" if definite else "an" if words[0] in "aeiou" else "a"
    return f"{article} {words}"


def _render_caption(objects: list[SceneObject], clauses: list[tuple[int, int | None]], with_size: bool,
                    there_is: bool) -> str:
    """Words for ``clauses``: ``(subject, reference)`` index pairs, or ``(index, None)`` for a bare mention."""
    named: set[int] = set()
    parts = []
    for subject, reference in clauses:
        words = []
        for index in (subject,) if reference is None else (subject, reference):
            words.append(_mention(objects[index], index in named, with_size))
            named.add(index)
        if reference is not None:
            words.insert(1, relation_of(objects[subject].centre, objects[reference].centre))
        parts.append(" ".join(words))
    return ("there is " if there_is else "") + " and ".join(parts)


def caption_variants(objects: list[SceneObject], image_size: int) -> list[str]:
    """Every distinct caption the grammar allows for ``objects`` under the generator's choices.

    Choices: which related pairs to state (any that link every object; where none can, every related pair
    and bare mentions of the rest), each clause's direction ("A left of B" or "B right of A"), the clause
    order, size words on or off, and "there is".
    """
    pairs = related_pairs(objects, image_size)
    everyone = set(range(len(objects)))
    clause_sets = [list(chosen) for chosen in itertools.combinations(pairs, len(objects) - 1)
                   if {i for pair in chosen for i in pair} == everyone]
    if not clause_sets:
        covered = {i for pair in pairs for i in pair}
        clause_sets = [[*pairs, *((i, None) for i in sorted(everyone - covered))]]
    variants = []
    for clause_set in clause_sets:
        for order in itertools.permutations(clause_set):
            relational = [k for k, (_, reference) in enumerate(order) if reference is not None]
            for flips in itertools.product((False, True), repeat=len(relational)):
                clauses = list(order)
                for k, flip in zip(relational, flips):
                    if flip:
                        clauses[k] = (clauses[k][1], clauses[k][0])
                for with_size, there_is in itertools.product((False, True), repeat=2):
                    variants.append(_render_caption(objects, clauses, with_size, there_is))
    return sorted(set(variants))


def sample_captions(objects: list[SceneObject], rng: np.random.Generator, image_size: int,
                    count: int = CAPTIONS_PER_IMAGE) -> list[str]:
    """``count`` captions drawn without replacement from :func:`caption_variants` (repeating only when
    fewer variants exist, as for a lone object)."""
    variants = caption_variants(objects, image_size)
    order = [int(k) for k in rng.permutation(len(variants))]
    while len(order) < count:
        order += [int(k) for k in rng.permutation(len(variants))]
    return [variants[k] for k in order[:count]]


# ------------------------------------------------------------------------------------------- rendering


@lru_cache(maxsize=4)
def _unit_grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-centre coordinates in [0, 1), as (ys, xs) float32 arrays of shape (size, size)."""
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size
    ys, xs = np.meshgrid(coords, coords, indexing="ij")
    ys.setflags(write=False)  # shared between images and threads
    xs.setflags(write=False)
    return ys, xs


def _muted_colour(rng: np.random.Generator) -> np.ndarray:
    """A random low- to mid-saturation, low- to mid-brightness RGB colour, float32 in 0-255."""
    rgb = colorsys.hsv_to_rgb(rng.random(), rng.uniform(0.05, 0.35), rng.uniform(0.3, 0.65))
    return np.array(rgb, dtype=np.float32) * 255


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A muted base colour, sometimes a smooth gradient to a second one, soft blotches, a coarse texture
    and per-pixel noise: float32 array of shape (size, size, 3)."""
    ys, xs = _unit_grid(size)
    image = np.empty((size, size, 3), dtype=np.float32)
    image[:] = _muted_colour(rng)
    if rng.random() < 0.5:
        angle = rng.uniform(0, 2 * math.pi)
        ramp = math.cos(angle) * xs + math.sin(angle) * ys
        ramp = (ramp - ramp.min()) / (ramp.max() - ramp.min())
        image += ramp[..., None] * (_muted_colour(rng) - image[0, 0])
    for _ in range(int(rng.integers(0, 4))):
        bx, by = rng.random(2).tolist()
        radius = rng.uniform(0.08, 0.25)
        blotch = np.exp(-((xs - bx) ** 2 + (ys - by) ** 2) / (2 * radius**2))
        image += blotch[..., None] * rng.uniform(-25, 25, size=3).astype(np.float32)
    if rng.random() < 0.5:
        coarse = rng.normal(0, rng.uniform(5, 15), size=(max(2, size // 16),) * 2).astype(np.float32)
        texture = np.asarray(Image.fromarray(coarse).resize((size, size), Image.Resampling.BILINEAR))
        image += texture[..., None]
    image += rng.standard_normal(size=(size, size, 3), dtype=np.float32) * rng.uniform(3, 12)
    return image


def _draw_distractors(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: int) -> None:
    """1-3 thin grey lines or small dark specks: nothing shaped or coloured like a named object."""
    scale = size / REFERENCE_SIZE
    for _ in range(int(rng.integers(1, 4))):
        if rng.random() < 0.5:
            grey = int(rng.integers(40, 200))
            draw.line(rng.uniform(0, size, 4).tolist(), fill=(grey, grey, grey), width=1)
        else:
            dark = int(rng.integers(10, 60))
            x, y = rng.uniform(0, size, 2).tolist()
            r = rng.uniform(0.8, 2.0) * scale
            draw.ellipse([x - r, y - r, x + r, y + r], fill=(dark, dark, dark))


def render_scene(objects: list[SceneObject], rng: np.random.Generator, image_size: int) -> Image.Image:
    """Draw ``objects`` on a fresh background (distractors, when any, lie under the objects)."""
    pixels = _background(rng, image_size)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    if rng.random() < 0.4:
        _draw_distractors(draw, rng, image_size)
    for obj in objects:
        jitter = rng.integers(-COLOUR_JITTER, COLOUR_JITTER + 1, size=3)
        fill = tuple(int(min(255, max(0, v + j))) for v, j in zip(COLOUR_RGB[obj.colour], jitter))
        if obj.shape == "circle":
            x, y, w, h = obj.bbox
            draw.ellipse([x, y, x + w, y + h], fill=fill)
        else:
            draw.polygon(outline(obj), fill=fill)
    return image


# --------------------------------------------------------------------------------------------- dataset


def sample_scene(seed: int, image_id: int, image_size: int) -> tuple[list[SceneObject], list[str]]:
    """The objects and captions of image ``image_id`` (no pixels; see :func:`render_image`)."""
    rng = np.random.default_rng([seed, image_id, 0])
    objects = sample_objects(rng, image_size)
    return objects, sample_captions(objects, rng, image_size)


def render_image(seed: int, image_id: int, objects: list[SceneObject], image_size: int) -> Image.Image:
    """The pixels of image ``image_id``, drawn from that image's own generator."""
    return render_scene(objects, np.random.default_rng([seed, image_id, 1]), image_size)


def _write_image(seed: int, image_id: int, image_size: int, path: Path) -> tuple[list[SceneObject], list[str]]:
    """Sample image ``image_id``, save its PNG to ``path`` and return its objects and captions."""
    objects, captions = sample_scene(seed, image_id, image_size)
    render_image(seed, image_id, objects, image_size).save(path, format="PNG", compress_level=1)
    return objects, captions


def _default_workers() -> int:
    """Threads for writing images: one more than the usable cores, so that one thread's Python work
    overlaps the others' PNG encoding and numpy work (which release the GIL)."""
    return usable_cores() + 1


def _split_sizes(num_images: int, split_fractions: tuple[float, float, float]) -> dict[str, int]:
    train = round(num_images * split_fractions[0])
    val = min(num_images - train, round(num_images * split_fractions[1]))
    return {"train": train, "val": val, "test": num_images - train - val}


def _least_images(num_images: int, split_fractions: tuple[float, float, float]) -> int:
    """The smallest number of images above ``num_images`` that gives every split at least one (the fractions
    all positive)."""
    return next(n for n in itertools.count(num_images + 1) if min(_split_sizes(n, split_fractions).values()) > 0)


def _check_arguments(seed: int, num_images: int, image_size: int, split_fractions: tuple[float, float, float],
                     workers: int | None) -> None:
    if not isinstance(seed, int) or seed < 0:
        raise CaptionerError(f"shapes data: seed must be a non-negative integer, got {seed!r}")
    if not isinstance(num_images, int) or num_images < 1:
        raise CaptionerError(f"shapes data: number of images must be a positive integer, got {num_images!r}")
    if not isinstance(image_size, int) or image_size < MIN_IMAGE_SIZE:
        raise CaptionerError(f"shapes data: image size must be an integer >= {MIN_IMAGE_SIZE}, got {image_size!r}")
    if (len(split_fractions) != len(SPLITS) or any(f <= 0 for f in split_fractions)
            or not math.isclose(sum(split_fractions), 1.0, abs_tol=1e-6)):
        raise CaptionerError(f"shapes data: split fractions must be three positive numbers (train, val, test) "
                             f"summing to 1, got {tuple(split_fractions)!r}")
    sizes = _split_sizes(num_images, split_fractions)
    empty = [split for split in SPLITS if sizes[split] == 0]
    if empty:
        least = _least_images(num_images, split_fractions)
        raise CaptionerError(f"shapes data: {num_images} image(s) leave the {' and '.join(empty)} split"
                             f"{'s' if len(empty) > 1 else ''} without images; the split fractions "
                             f"{tuple(split_fractions)} need at least {least} images")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise CaptionerError(f"shapes data: workers must be a positive integer, got {workers!r}")


def annotation_info(path: Path) -> dict:
    """The ``info`` block of a COCO-format annotation file, ``{}`` when it has none or cannot be read."""
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    info = content.get("info") if isinstance(content, dict) else None
    return info if isinstance(info, dict) else {}


def is_shapes(info: dict) -> bool:
    """Whether an annotation file's ``info`` block (:func:`annotation_info`) is the shapes data's."""
    return info.get("description") == DESCRIPTION


def shapes_info(path: Path) -> dict | None:
    """The ``info`` block of the shapes annotation file ``path``; None when ``path`` is none (missing,
    unreadable, not JSON, or another dataset's)."""
    info = annotation_info(path)
    return info if is_shapes(info) else None


def _output_files(out_dir: Path) -> list[Path]:
    """The files in ``out_dir`` named as :func:`generate_shapes` names its output, whoever wrote them: the
    images, then the annotation files."""
    images = [path for split in SPLITS for path in sorted((out_dir / "images" / split).glob("*.png"))
              if re.fullmatch(r"\d{6,}\.png", path.name)]
    annotations = [out_dir / "annotations" / f"{kind}_{split}.json" for kind in ("captions", "instances")
                   for split in SPLITS]
    return images + [path for path in annotations if path.is_file()]


def _earlier_output(out_dir: Path, replace: bool) -> list[Path]:
    """The files of an earlier shapes dataset in ``out_dir``, for :func:`generate_shapes` to delete before it
    writes. Unless ``replace``, ``out_dir`` must be missing, empty, or hold such a dataset (its annotation
    files carry the shapes ``info``) and nothing else, else :class:`CaptionerError`; with ``replace``, every
    file named as shapes output counts as such, and whatever else ``out_dir`` holds stays."""
    if not out_dir.is_dir():
        return []                   # missing (a file in its place fails the writing, named)
    earlier = _output_files(out_dir)
    if replace:
        return earlier
    annotations = [path for path in earlier if path.suffix == ".json"]
    others = {path for path in out_dir.rglob("*") if not path.is_dir()} - set(earlier)
    if others or (earlier and not annotations) or any(shapes_info(path) is None for path in annotations):
        raise CaptionerError(f"{out_dir}: holds files that are not shapes data; choose an empty or new folder (--out)")
    return earlier


def _object_annotation(obj: SceneObject, annotation_id: int, image_id: int, category_id: int) -> dict:
    points = outline(obj)
    return {"id": annotation_id, "image_id": image_id, "category_id": category_id,
            "bbox": [round(v, 2) for v in obj.bbox], "area": round(polygon_area(points), 2), "iscrowd": 0,
            "segmentation": [[round(v, 2) for point in points for v in point]],
            "colour": obj.colour, "size": obj.size}


def _write_annotations(folder: Path, info: dict, categories: list[dict], tables: dict[str, dict]) -> dict:
    """Each split's ``captions_{split}.json`` and ``instances_{split}.json`` (COCO format) into ``folder``, from its
    ``tables`` (``images``, ``captions``, ``objects``); returns ``{split: {"images": count, "captions": path,
    "instances": path}}``."""
    splits = {}
    for split in SPLITS:
        common = {"info": info, "licenses": [], "images": tables[split]["images"]}
        captions_path = folder / f"captions_{split}.json"
        instances_path = folder / f"instances_{split}.json"
        captions_file = {**common, "annotations": tables[split]["captions"]}
        instances_file = {**common, "annotations": tables[split]["objects"], "categories": categories}
        captions_path.write_text(json.dumps(captions_file, sort_keys=True), encoding="utf-8")
        instances_path.write_text(json.dumps(instances_file, sort_keys=True), encoding="utf-8")
        splits[split] = {"images": len(tables[split]["images"]), "captions": str(captions_path),
                         "instances": str(instances_path)}
    return splits


def generate_shapes(out_dir: str | Path, *, seed: int = 0, num_images: int = 3000, image_size: int = 128,
                    split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1), workers: int | None = None,
                    replace: bool = False) -> dict:
    """Write the shapes dataset into ``out_dir`` (layout in the module docstring); return a summary of it.

    ``out_dir`` must be missing, empty or hold only an earlier shapes dataset, which is deleted first; with
    ``replace`` other files may stay, and only files named as this output are deleted. The same arguments give
    byte-identical files whatever the number of ``workers`` (threads). Raises :class:`CaptionerError` for bad
    arguments, an ``out_dir`` holding other files (before anything is written) or an unwritable one.
    """
    _check_arguments(seed, num_images, image_size, tuple(split_fractions), workers)
    out_dir = Path(out_dir)
    earlier = _earlier_output(out_dir, replace)
    info = {"description": DESCRIPTION, "seed": seed, "num_images": num_images, "image_size": image_size,
            "split_fractions": list(split_fractions), "version": FORMAT_VERSION}
    categories = [{"id": k + 1, "name": shape, "supercategory": "shape"} for k, shape in enumerate(SHAPES)]
    category_id = {c["name"]: c["id"] for c in categories}
    sizes = _split_sizes(num_images, split_fractions)
    split_of = [split for split in SPLITS for _ in range(sizes[split])]
    tables = {split: {"images": [], "captions": [], "objects": []} for split in SPLITS}
    objects_per_image: dict[int, int] = {}
    caption_id = object_id = 0
    try:
        for path in earlier:
            path.unlink()
        (out_dir / "annotations").mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            (out_dir / "images" / split).mkdir(parents=True, exist_ok=True)
        file_names = [f"{split}/{image_id:06d}.png" for image_id, split in enumerate(split_of, start=1)]
        with ThreadPoolExecutor(workers or _default_workers()) as pool:
            scenes = list(pool.map(_write_image, itertools.repeat(seed), range(1, num_images + 1),
                                   itertools.repeat(image_size), (out_dir / "images" / name for name in file_names)))
        for image_id, (split, file_name, (objects, captions)) in enumerate(zip(split_of, file_names, scenes), start=1):
            table = tables[split]
            table["images"].append({"id": image_id, "file_name": file_name, "width": image_size, "height": image_size})
            for caption in captions:
                caption_id += 1
                table["captions"].append({"id": caption_id, "image_id": image_id, "caption": caption})
            for obj in objects:
                object_id += 1
                table["objects"].append(_object_annotation(obj, object_id, image_id, category_id[obj.shape]))
            objects_per_image[len(objects)] = objects_per_image.get(len(objects), 0) + 1
        splits = _write_annotations(out_dir / "annotations", info, categories, tables)
    except OSError as err:
        raise CaptionerError(f"{err.filename or out_dir}: cannot write the shapes data ({err.strerror})") from None
    return {"out": str(out_dir), "images": num_images, "seed": seed, "image_size": image_size,
            "objects_per_image": dict(sorted(objects_per_image.items())), "splits": splits}
