"""Readers for caption annotations: the official COCO captions JSON and Karpathy split files.

Both return :class:`ImageRecord` lists: one record per image with every caption of that image, so
training can iterate over (image, caption) pairs while evaluation scores against all references.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pycocotools.coco import COCO

from captioner.core.files import read_json
from captioner.core.memory import release_freed_memory
from captioner.data.config import DataConfig
from captioner.data.text import has_words
from captioner.errors import CaptionerError


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
    cleaned = " ".join(text.split())
    return text if cleaned == text else cleaned      # the file's string itself when clean: no second copy


def coco_api(path: str | Path, data: dict | None = None):
    """A pycocotools ``COCO`` object for an annotation file, with parse errors reported by file and line;
    ``data``: the file's parsed JSON, when the caller has it already (the file is not read again)."""
    data = read_json(path) if data is None else data
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
            if not has_words(caption):
                raise CaptionerError(f"{where}: caption {ann['caption']!r} has no words")
            captions.append(caption)
        if captions:
            records.append(ImageRecord(int(image_id), images_dir / coco.imgs[image_id]["file_name"], captions, split))
    dangling = set(coco.imgToAnns) - set(coco.imgs)
    if dangling:
        raise CaptionerError(f"{captions_file}: captions refer to image id(s) not listed in 'images': "
                             f"{sorted(dangling)[:5]}")
    return records


def _sentence_text(item: dict) -> dict | tuple[str]:
    """A Karpathy file's objects as they are parsed: a sentence becomes ``(raw,)``, the rest stays. Its ``tokens``
    (unused here) would otherwise be most of the parsed file's memory, and scattered among the captions kept."""
    raw = item.get("raw")
    return (raw,) if isinstance(raw, str) and "sentences" not in item and "images" not in item else item


def read_karpathy_splits(split_file: str | Path, image_root: str | Path, splits: Sequence[str],
                         restval: str = "train") -> dict[str, list[ImageRecord]]:
    """The records of ``splits`` of a Karpathy split file (``dataset_coco.json``, ``dataset_flickr8k.json``,
    ``dataset_flickr30k.json``), the file parsed once: ``{split: records}``.

    ``restval`` images join the split named by ``restval`` (train by default). Image ids are COCO ids
    where the file has them (``cocoid``), else the file's ``imgid``.
    """
    split_file, image_root = Path(split_file), Path(image_root)
    data = read_json(split_file, object_hook=_sentence_text)
    _require(data, ("images",), str(split_file))
    records: dict[str, list[ImageRecord]] = {split: [] for split in splits}
    for index, entry in enumerate(data["images"]):
        where = f"{split_file}: images[{index}]"
        _require(entry, ("filename", "split", "sentences"), where)
        entry_split = restval if entry["split"] == "restval" else entry["split"]
        if entry_split not in records:
            continue
        captions = []
        for k, sentence in enumerate(entry["sentences"]):
            if not isinstance(sentence, tuple):      # not read as a sentence: say what is wrong with it
                _require(sentence, ("raw",), f"{where}.sentences[{k}]")
            raw = sentence[0] if isinstance(sentence, tuple) else sentence["raw"]
            caption = _clean_caption(raw, f"{where}.sentences[{k}]")
            if not has_words(caption):
                raise CaptionerError(f"{where}.sentences[{k}]: caption {raw!r} has no words")
            captions.append(caption)
        image_id = entry.get("cocoid", entry.get("imgid", index))
        path = image_root / entry.get("filepath", "") / entry["filename"]
        records[entry_split].append(ImageRecord(int(image_id), path, captions, entry_split))
    return records


def read_split(data_config: DataConfig, split: str) -> list[ImageRecord]:
    """The records of one split as the ``data`` section of a config describes them."""
    return read_splits(data_config, (split,))[split]


def read_splits(data_config: DataConfig, splits: Sequence[str]) -> dict[str, list[ImageRecord]]:
    """``{split: records}`` of several splits (:func:`read_split`), a Karpathy file parsed once for all of them. The
    memory that parsing took is handed back to the system afterwards (:func:`~captioner.core.memory.release_freed_memory`):
    it would otherwise stay in this process, and in every DataLoader worker forked from it."""
    try:
        return _read_splits(data_config, splits)
    finally:
        release_freed_memory()


# The command that makes a data file a config names, by the file's name; {root}: the folder it makes.
MADE_BY = ((re.compile(r"dataset_flickr8k\.json"), "captioner data flickr8k --root {root}", 0),
           (re.compile(r"dataset_coco\.json"), "captioner data coco --root {root}", 0),
           (re.compile(r"captions_(train|val)2014\.json"), "captioner data coco --root {root}", 1),
           (re.compile(r"captions_(train|val)2017\.json"), "captioner data coco --root {root} --year 2017", 1))


def require_data(path: str | Path, settings: str) -> None:
    """One line when a caption or split file a config's ``data`` section names is not there: the ``captioner data``
    command that makes it (judged by its name) and the ``settings`` that name it otherwise. (Image folders are not
    required: a run from cached features reads none.)"""
    path = Path(path)
    if path.exists():
        return
    for pattern, command, up in MADE_BY:
        if pattern.fullmatch(path.name):
            root = path.parents[up]
            raise CaptionerError(f"{path}: not found; make it with: {command.format(root=root)} (or set {settings})")
    raise CaptionerError(f"{path}: not found; set {settings}")


def _first(records: list[ImageRecord], split: str, data_config: DataConfig) -> list[ImageRecord]:
    """``records`` cut to ``data.max_train_images`` / ``data.max_val_images`` for those splits."""
    limit = {"train": data_config.max_train_images, "val": data_config.max_val_images}.get(split)
    return records[:limit] if limit else records


def _read_splits(data_config: DataConfig, splits: Sequence[str]) -> dict[str, list[ImageRecord]]:
    if data_config.format == "coco":
        out = {}
        for split in splits:
            captions, images = data_config.captions, data_config.images
            if split not in captions or split not in images:
                raise CaptionerError(f"config: data.captions and data.images need an entry for split '{split}'")
            require_data(captions[split], "data.captions and data.images")
            out[split] = _first(read_coco_captions(captions[split], images[split], split), split, data_config)
            if not out[split]:
                raise CaptionerError(f"{captions[split]}: no captioned images in split '{split}'")
        return out
    if data_config.format == "karpathy":
        if not data_config.karpathy or not data_config.image_root:
            raise CaptionerError("config: data.format=karpathy needs data.karpathy and data.image_root")
        require_data(data_config.karpathy, "data.karpathy and data.image_root")
        out = read_karpathy_splits(data_config.karpathy, data_config.image_root, splits, data_config.restval)
        for split, records in out.items():
            if not records:
                raise CaptionerError(f"{data_config.karpathy}: no images in split '{split}'")
            out[split] = _first(records, split, data_config)
        return out
    raise CaptionerError(f"config: data.format must be coco or karpathy, not {data_config.format!r}")


SPLITS = ("train", "val", "test")


def available_splits(data_config: DataConfig) -> list[str]:
    """The splits of :data:`SPLITS` that the ``data`` section describes: those with captions and images (coco),
    or those the split file holds images of (karpathy; ``restval`` counted where it goes)."""
    if data_config.format == "karpathy" and data_config.karpathy:
        require_data(data_config.karpathy, "data.karpathy and data.image_root")
        data = read_json(data_config.karpathy)
        _require(data, ("images",), str(data_config.karpathy))
        found = {data_config.restval if entry.get("split") == "restval" else entry.get("split")
                 for entry in data["images"] if isinstance(entry, dict)}
        return [split for split in SPLITS if split in found]
    return [split for split in SPLITS if split in data_config.captions and split in data_config.images]
