"""The embedded default dataset: synthetic scenes of coloured shapes with spatial-relation captions.

``generate_shapes(out_dir, seed=..., num_images=...)`` writes real PNG files and COCO-format
annotations, so the whole pipeline (readers, pycocotools, metrics, grounding) runs on it unchanged::

    out_dir/images/{train,val,test}/{image_id:06d}.png
    out_dir/annotations/captions_{split}.json     COCO captions: five per image
    out_dir/annotations/instances_{split}.json    COCO instances: category (shape), bbox, polygon,
                                                   plus "colour" and "size" per object

A scene holds 1-3 objects (shape, colour, size), never two of the same colour and shape, on a noisy,
textured background with occasional distractors (grey lines, dark specks). Captions follow a small
grammar that :mod:`captioner.evaluation.shapes_metrics` parses back::

    mention  := "a" [size] colour shape                  "a small red circle"
    relation := "to the left of" | "to the right of" | "above" | "below"
    clause   := mention [relation mention]
    caption  := ["there is"] clause (" and " clause)*

Every caption names every object; with two or more objects, captions state relations, which a bag of
region features cannot get right. A relation is stated only when it is unambiguous: along the axis of
larger centre separation, at least twice the other axis and at least a quarter of the image apart.
Output is deterministic for a seed (each image draws from its own generator seeded by (seed, id)).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("circle", "square", "triangle", "diamond", "cross")
COLOURS = {"red": (215, 35, 35), "green": (40, 170, 60), "blue": (45, 85, 230),
           "yellow": (240, 215, 40), "purple": (150, 55, 200), "white": (245, 245, 245)}
SIZES = ("small", "large")
RELATIONS = ("to the left of", "to the right of", "above", "below")
INVERSE = {"to the left of": "to the right of", "to the right of": "to the left of", "above": "below", "below": "above"}
OBJECT_COUNT_PROBABILITIES = (0.2, 0.4, 0.4)   # 1, 2, 3 objects
SPLITS = ("train", "val", "test")


@dataclass
class ShapeObject:
    shape: str
    colour: str
    size: str
    cx: float
    cy: float
    extent: float  # width of the shape's bounding square, px

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


def relation_between(a_xy: tuple[float, float], b_xy: tuple[float, float]) -> str:
    """The relation of A to B by the axis of larger centre separation (image y points down)."""
    dx, dy = b_xy[0] - a_xy[0], b_xy[1] - a_xy[1]
    if abs(dx) >= abs(dy):
        return "to the left of" if dx > 0 else "to the right of"
    return "above" if dy > 0 else "below"


def is_unambiguous(a: ShapeObject, b: ShapeObject, image_size: int) -> bool:
    """Whether the relation between ``a`` and ``b`` is clear enough to state in a caption."""
    dx, dy = abs(b.cx - a.cx), abs(b.cy - a.cy)
    major, minor = max(dx, dy), min(dx, dy)
    return major >= 2 * minor and major >= 0.25 * image_size


def polygon(obj: ShapeObject) -> list[tuple[float, float]]:
    """The outline of ``obj`` as a polygon in pixel coordinates (also its COCO segmentation)."""
    r = obj.extent / 2
    cx, cy = obj.cx, obj.cy
    if obj.shape == "circle":
        return [(cx + r * math.cos(2 * math.pi * k / 24), cy + r * math.sin(2 * math.pi * k / 24)) for k in range(24)]
    if obj.shape == "square":
        s = r * 0.85
        return [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    if obj.shape == "triangle":
        return [(cx, cy - r), (cx + r, cy + r * 0.8), (cx - r, cy + r * 0.8)]
    if obj.shape == "diamond":
        return [(cx, cy - r), (cx + r * 0.75, cy), (cx, cy + r), (cx - r * 0.75, cy)]
    t = r * 0.33  # cross: a plus sign of arm half-width t
    return [(cx - t, cy - r), (cx + t, cy - r), (cx + t, cy - t), (cx + r, cy - t), (cx + r, cy + t), (cx + t, cy + t),
            (cx + t, cy + r), (cx - t, cy + r), (cx - t, cy + t), (cx - r, cy + t), (cx - r, cy - t), (cx - t, cy - t)]


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A muted base colour with a gradient, soft blotches and pixel noise, (size, size, 3) float."""
    base = rng.uniform(70, 150) + rng.uniform(-25, 25, size=3)
    ys, xs = np.mgrid[0:size, 0:size] / size
    angle = rng.uniform(0, 2 * np.pi)
    gradient = (np.cos(angle) * xs + np.sin(angle) * ys - 0.5) * rng.uniform(0, 50)
    image = base[None, None, :] + gradient[..., None]
    for _ in range(rng.integers(0, 4)):
        bx, by, radius = rng.uniform(0, size, 2).tolist() + [rng.uniform(size / 8, size / 3)]
        blotch = np.exp(-(((xs * size - bx) ** 2 + (ys * size - by) ** 2) / (2 * radius**2)))
        image += blotch[..., None] * rng.uniform(-30, 30, size=3)
    image += rng.normal(0, rng.uniform(4, 14), size=image.shape)
    return image


def _draw_distractors(draw: ImageDraw.ImageDraw, rng: np.random.Generator, size: int) -> None:
    for _ in range(rng.integers(1, 4)):
        grey = int(rng.integers(20, 200))
        if rng.random() < 0.5:
            x0, y0, x1, y1 = rng.uniform(0, size, 4).tolist()
            draw.line([(x0, y0), (x1, y1)], fill=(grey, grey, grey), width=1)
        else:
            x, y = rng.uniform(0, size, 2).tolist()
            r = rng.uniform(1, 2.5)
            draw.ellipse([x - r, y - r, x + r, y + r], fill=(grey // 3, grey // 3, grey // 3))


def _place_objects(rng: np.random.Generator, count: int, size: int) -> list[ShapeObject] | None:
    """Sample non-overlapping objects whose relations can be described; None if no layout was found."""
    kinds = set()
    while len(kinds) < count:
        kinds.add((SHAPES[rng.integers(len(SHAPES))], list(COLOURS)[rng.integers(len(COLOURS))]))
    kinds = sorted(kinds, key=lambda k: rng.random())
    scale = size / 128
    for _ in range(200):
        objects = []
        for shape, colour in kinds:
            size_word = SIZES[rng.integers(2)]
            extent = (rng.uniform(20, 26) if size_word == "small" else rng.uniform(34, 42)) * scale
            margin = extent / 2 + 2
            cx, cy = rng.uniform(margin, size - margin, 2)
            objects.append(ShapeObject(shape, colour, size_word, float(cx), float(cy), float(extent)))
        overlap = any(math.hypot(a.cx - b.cx, a.cy - b.cy) < (a.extent + b.extent) / 2 + 4 * scale
                      for i, a in enumerate(objects) for b in objects[i + 1 :])
        if overlap:
            continue
        if count == 1 or is_unambiguous(objects[0], objects[1], size):
            if count < 3 or any(is_unambiguous(objects[2], o, size) for o in objects[:2]):
                return objects
    return None


def _mention(obj: ShapeObject, with_size: bool) -> str:
    return f"a {obj.size} {obj.name}" if with_size else f"a {obj.name}"


def _clause(a: ShapeObject, b: ShapeObject, flip: bool, with_size: bool) -> str:
    """``a REL b``, or the same fact from ``b``'s side when ``flip``."""
    if flip:
        a, b = b, a
    return f"{_mention(a, with_size)} {relation_between((a.cx, a.cy), (b.cx, b.cy))} {_mention(b, with_size)}"


def captions_for(objects: list[ShapeObject], rng: np.random.Generator, image_size: int, count: int = 5) -> list[str]:
    """``count`` distinct captions (when the scene allows) that name every object; see the module grammar."""
    captions: list[str] = []
    for attempt in range(40):
        with_size = bool(rng.random() < 0.5)
        prefix = "there is " if rng.random() < 0.3 else ""
        flip = [bool(rng.random() < 0.5) for _ in range(2)]
        if len(objects) == 1:
            body = _mention(objects[0], with_size)
        elif len(objects) == 2:
            body = _clause(objects[0], objects[1], flip[0], with_size)
        else:
            a, b, c = objects
            partner = [o for o in (a, b) if is_unambiguous(c, o, image_size)]
            first = _clause(a, b, flip[0], with_size)
            second = _clause(c, partner[rng.integers(len(partner))], flip[1], with_size)
            body = f"{first} and {second}" if rng.random() < 0.5 else f"{second} and {first}"
        caption = prefix + body
        if caption not in captions or attempt >= 30:
            captions.append(caption)
        if len(captions) == count:
            break
    return captions


def render_scene(objects: list[ShapeObject], rng: np.random.Generator, size: int) -> Image.Image:
    pixels = _background(rng, size)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    if rng.random() < 0.5:
        _draw_distractors(draw, rng, size)
    for obj in objects:
        jitter = rng.integers(-12, 13, size=3)
        fill = tuple(int(np.clip(v + j, 0, 255)) for v, j in zip(COLOURS[obj.colour], jitter))
        if obj.shape == "circle":
            r = obj.extent / 2
            draw.ellipse([obj.cx - r, obj.cy - r, obj.cx + r, obj.cy + r], fill=fill)
        else:
            draw.polygon(polygon(obj), fill=fill)
    return image


def generate_scene(seed: int, image_id: int, image_size: int) -> tuple[Image.Image, list[ShapeObject], list[str]]:
    """One image, its objects and five captions, from its own generator (independent of other images)."""
    rng = np.random.default_rng([seed, image_id])
    objects = None
    while objects is None:
        count = int(rng.choice([1, 2, 3], p=OBJECT_COUNT_PROBABILITIES))
        objects = _place_objects(rng, count, image_size)
    return render_scene(objects, rng, image_size), objects, captions_for(objects, rng, image_size)


def _split_of(index: int, num_images: int, split_fractions: tuple[float, float, float]) -> str:
    train_end = round(num_images * split_fractions[0])
    val_end = train_end + round(num_images * split_fractions[1])
    return "train" if index < train_end else "val" if index < val_end else "test"


def generate_shapes(out_dir: str | Path, *, seed: int = 0, num_images: int = 3000, image_size: int = 128,
                    split_fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> dict:
    """Write the dataset (see the module docstring); returns counts per split and the annotation paths."""
    out_dir = Path(out_dir)
    (out_dir / "annotations").mkdir(parents=True, exist_ok=True)
    info = {"description": "captioner synthetic shapes", "seed": seed, "num_images": num_images,
            "image_size": image_size, "version": 1}
    categories = [{"id": k + 1, "name": shape, "supercategory": "shape"} for k, shape in enumerate(SHAPES)]
    category_id = {c["name"]: c["id"] for c in categories}
    data = {split: {"images": [], "captions": [], "objects": []} for split in SPLITS}
    caption_id = object_id = 0
    for index in range(num_images):
        image_id = index + 1
        split = _split_of(index, num_images, split_fractions)
        image, objects, captions = generate_scene(seed, image_id, image_size)
        file_name = f"{split}/{image_id:06d}.png"
        (out_dir / "images" / split).mkdir(parents=True, exist_ok=True)
        image.save(out_dir / "images" / file_name, compress_level=1)
        data[split]["images"].append({"id": image_id, "file_name": file_name, "width": image_size, "height": image_size})
        for caption in captions:
            caption_id += 1
            data[split]["captions"].append({"id": caption_id, "image_id": image_id, "caption": caption})
        for obj in objects:
            object_id += 1
            outline = polygon(obj)
            xs, ys = [p[0] for p in outline], [p[1] for p in outline]
            x0, y0 = max(0.0, min(xs)), max(0.0, min(ys))
            x1, y1 = min(float(image_size), max(xs)), min(float(image_size), max(ys))
            area = 0.5 * abs(sum(xs[i] * ys[i - 1] - xs[i - 1] * ys[i] for i in range(len(xs))))
            data[split]["objects"].append({
                "id": object_id, "image_id": image_id, "category_id": category_id[obj.shape],
                "bbox": [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)], "area": round(area, 2),
                "iscrowd": 0, "segmentation": [[round(v, 2) for p in outline for v in p]],
                "colour": obj.colour, "size": obj.size})
    paths = {}
    for split in SPLITS:
        common = {"info": info, "licenses": [], "images": data[split]["images"]}
        captions_path = out_dir / "annotations" / f"captions_{split}.json"
        instances_path = out_dir / "annotations" / f"instances_{split}.json"
        captions_path.write_text(json.dumps({**common, "annotations": data[split]["captions"]}, sort_keys=True))
        instances_path.write_text(json.dumps({**common, "annotations": data[split]["objects"], "categories": categories},
                                             sort_keys=True))
        paths[split] = {"images": len(data[split]["images"]), "captions": str(captions_path),
                        "instances": str(instances_path)}
    return {"out": str(out_dir), "seed": seed, "splits": paths}
