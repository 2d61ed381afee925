"""Readers for caption annotations: the official COCO captions JSON and Karpathy split files.

Both return :class:`ImageRecord` lists: one record per image with every caption of that image, so
training can iterate over (image, caption) pairs while evaluation scores against all references.
"""

from __future__ import annotations

import contextlib
import io
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from pycocotools.coco import COCO

from captioner.data.text import tokenize
from captioner.errors import CaptionerError
from captioner.utils import read_json


@dataclass
class ImageRecord:
    """One image and all its reference captions."""

    image_id: int
    path: Path
    captions: list[str] = field(default_factory=list)
    split: str = "train"


def _require(mapping: object, keys: tuple[str, ...], where: str) -> None:
    if not isinstance(mapping, dict):
        raise CaptionerError(f"{where}: expected an object, got {type(mapping).__name__}")
    missing = [k for k in keys if k not in mapping]
    if missing:
        raise CaptionerError(f"{where}: missing key(s) {', '.join(repr(k) for k in missing)}")


def _clean_caption(text: object, where: str) -> str:
    if not isinstance(text, str):
        raise CaptionerError(f"{where}: caption must be a string, got {type(text).__name__}")
    return " ".join(text.split())


def coco_api(path: str | Path):
    """A pycocotools ``COCO`` object for an annotation file, with parse errors reported by file and line."""
    data = read_json(path)
    _require(data, ("images", "annotations"), str(path))
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            coco.createIndex()
        except (KeyError, TypeError) as err:
            raise CaptionerError(f"{path}: malformed COCO annotations ({err!r})") from None
    return coco


def read_coco_captions(captions_file: str | Path, images_dir: str | Path, split: str) -> list[ImageRecord]:
    """Official COCO captions JSON (``captions_train2014.json`` ...) through pycocotools.

    Images without any caption are kept out; captions that are empty after tokenisation are an error
    naming the annotation id, since they would train the model to stop at once.
    """
    captions_file, images_dir = Path(captions_file), Path(images_dir)
    coco = coco_api(captions_file)
    records = []
    for index, image in enumerate(coco.dataset["images"]):
        _require(image, ("id", "file_name"), f"{captions_file}: images[{index}]")
    for image_id in sorted(coco.imgs):
        captions = []
        for ann in coco.imgToAnns.get(image_id, []):
            where = f"{captions_file}: annotation id {ann.get('id')}"
            _require(ann, ("caption",), where)
            caption = _clean_caption(ann["caption"], where)
            if not tokenize(caption):
                raise CaptionerError(f"{where}: caption {ann['caption']!r} has no words")
            captions.append(caption)
        if captions:
            records.append(ImageRecord(int(image_id), images_dir / coco.imgs[image_id]["file_name"], captions, split))
    dangling = set(coco.imgToAnns) - set(coco.imgs)
    if dangling:
        raise CaptionerError(f"{captions_file}: captions refer to image id(s) not listed in 'images': "
                             f"{sorted(dangling)[:5]}")
    return records


def read_karpathy(split_file: str | Path, image_root: str | Path, split: str, restval: str = "train") -> list[ImageRecord]:
    """Karpathy split files (``dataset_coco.json``, ``dataset_flickr8k.json``, ``dataset_flickr30k.json``).

    ``restval`` images join the split named by ``restval`` (train by default). Image ids are COCO ids
    where the file has them (``cocoid``), else the file's ``imgid``.
    """
    split_file, image_root = Path(split_file), Path(image_root)
    data = read_json(split_file)
    _require(data, ("images",), str(split_file))
    records = []
    for index, entry in enumerate(data["images"]):
        where = f"{split_file}: images[{index}]"
        _require(entry, ("filename", "split", "sentences"), where)
        entry_split = restval if entry["split"] == "restval" else entry["split"]
        if entry_split != split:
            continue
        captions = []
        for k, sentence in enumerate(entry["sentences"]):
            _require(sentence, ("raw",), f"{where}.sentences[{k}]")
            caption = _clean_caption(sentence["raw"], f"{where}.sentences[{k}]")
            if not tokenize(caption):
                raise CaptionerError(f"{where}.sentences[{k}]: caption {sentence['raw']!r} has no words")
            captions.append(caption)
        image_id = entry.get("cocoid", entry.get("imgid", index))
        path = image_root / entry.get("filepath", "") / entry["filename"]
        records.append(ImageRecord(int(image_id), path, captions, split))
    return records


def read_split(data_config: dict, split: str) -> list[ImageRecord]:
    """The records of one split as the ``data`` section of a config describes them."""
    if data_config["format"] == "coco":
        captions, images = data_config["captions"], data_config["images"]
        if split not in captions or split not in images:
            raise CaptionerError(f"config: data.captions and data.images need an entry for split '{split}'")
        records = read_coco_captions(captions[split], images[split], split)
        if not records:
            raise CaptionerError(f"{captions[split]}: no captioned images in split '{split}'")
        return records
    if data_config["format"] == "karpathy":
        if not data_config["karpathy"] or not data_config["image_root"]:
            raise CaptionerError("config: data.format=karpathy needs data.karpathy and data.image_root")
        records = read_karpathy(data_config["karpathy"], data_config["image_root"], split, data_config["restval"])
        if not records:
            raise CaptionerError(f"{data_config['karpathy']}: no images in split '{split}'")
        return records
    raise CaptionerError(f"config: data.format must be coco or karpathy, not {data_config['format']!r}")


def group_by_image(records: list[ImageRecord]) -> dict[int, list[str]]:
    """``{image_id: [captions]}`` (the references for evaluation)."""
    out: dict[int, list[str]] = defaultdict(list)
    for record in records:
        out[record.image_id].extend(record.captions)
    return dict(out)
