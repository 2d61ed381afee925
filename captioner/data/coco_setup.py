"""MS-COCO from an empty folder to the files ``configs/coco_*.yaml`` read (``captioner data coco``).

Steps, in this order, each skipped when its result is already in place (a second run downloads nothing and
only verifies):

1. Disk check against ``shutil.disk_usage(root).free`` before any request, sizes from :data:`ARCHIVES` (each zip
   is deleted once unpacked unless ``keep_zips``).
2. The Karpathy split (``split="karpathy"``): ``--karpathy-file``, ``ROOT/dataset_coco_karpathy.json``, then
   :data:`KARPATHY_SOURCES` in order, each accepted only when :func:`check_karpathy` passes it.
3. The official zips of the year, downloaded resumably (:func:`captioner.data.download.download`), checked and
   unpacked into a temporary folder renamed into place, so an interrupted unpack never looks finished. A damaged
   zip is downloaded once more, then is an error.
4. ``dataset_coco.json``, ``instances_valtest.json``, ``vocab.json`` and ``coco_setup.json`` (with digests) in
   ROOT, rewritten only when their inputs changed.

``split="official"`` (2017 only) needs no Karpathy file: val is :data:`HELD_OUT` train2017 images drawn with a
fixed seed, test is val2017.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shlex
import shutil
import zipfile
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from captioner.core.files import file_sha256, read_json, read_record, write_file
from captioner.data.archives import Damaged, fetch_zip, human_bytes, open_zip
from captioner.data.download import DownloadError, download, part_path
from captioner.errors import CaptionerError

log = logging.getLogger(__name__)

COCO_URL = "http://images.cocodataset.org"     # zips/{train,val}YEAR.zip, annotations/annotations_trainvalYEAR.zip


@dataclass(frozen=True)
class Archive:
    """An official zip: bytes as served, bytes unpacked (an estimate for the disk check) and its ``.jpg``
    images (0 for annotations)."""

    size: int
    unpacked: int
    images: int = 0


ARCHIVES: dict[str, Archive] = {    # image zips hold JPEGs, which unpack to about the zip's size
    "annotations_trainval2014.zip": Archive(252_872_794, 845_000_000),
    "train2014.zip": Archive(13_510_573_713, 13_510_573_713, 82_783),
    "val2014.zip": Archive(6_645_013_297, 6_645_013_297, 40_504),
    "annotations_trainval2017.zip": Archive(252_907_541, 836_000_000),
    "train2017.zip": Archive(19_336_861_798, 19_336_861_798, 118_287),
    "val2017.zip": Archive(815_585_330, 815_585_330, 5_000),
}
OUTPUT_BYTES = 500_000_000          # the split file(s) and the files written, for the disk check


@dataclass(frozen=True)
class KarpathySource:
    """Where the Karpathy split can be downloaded: ``kind`` ``karpathy_zip`` (``caption_datasets.zip`` with
    ``dataset_coco.json``) or ``blip`` (the ``coco_karpathy_{train,val,test}.json`` URLs, in that order)."""

    name: str
    kind: str
    urls: tuple[str, ...]


_BLIP = "https://storage.googleapis.com/sfr-vision-language-research/datasets/coco_karpathy_{}.json"
KARPATHY_SOURCES: list[KarpathySource] = [
    KarpathySource("Karpathy's caption_datasets.zip", "karpathy_zip",
                   ("https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip",)),
    KarpathySource("Salesforce BLIP/LAVIS coco_karpathy_{train,val,test}.json", "blip",
                   tuple(_BLIP.format(part) for part in ("train", "val", "test"))),
]
KARPATHY_COUNTS = {"train": 113_287, "val": 5_000, "test": 5_000}   # images; train counts restval too
MIN_CAPTIONS = 5                    # captions of every image of the Karpathy split, at least
HELD_OUT = 5_000                    # split official: train2017 images held out as val
HELD_OUT_SEED = 0
VOCAB_MIN_COUNT = 5                 # as configs/coco_soft.yaml
MAX_CAPTION_LENGTH = 20
VGG19_FEATURE_BYTES = 14 * 14 * 512 * 2   # the fp16 features of one image in configs/coco_soft.yaml's cache
SETUP_VERSION = 1                   # in coco_setup.json; bump when the outputs change

KARPATHY_FILE = "dataset_coco_karpathy.json"
OUTPUTS = ("dataset_coco.json", "instances_valtest.json", "vocab.json")
RECORD = "coco_setup.json"
CONFIG_ROOT = Path("data/coco")     # the root configs/coco_*.yaml name
BY_HAND = ("place Karpathy's dataset_coco.json (from caption_datasets.zip, e.g. Kaggle's 'karpathy-splits') or "
           "the folder of BLIP's coco_karpathy_{train,val,test}.json and pass --karpathy-file PATH")


class Rejected(Exception):
    """A Karpathy source whose content fails the checks; the message says how."""


# ---------------------------------------------------------------------------------------------- sizes


def zip_url(name: str) -> str:
    folder = "annotations" if name.startswith("annotations") else "zips"
    return f"{COCO_URL}/{folder}/{name}"


def annotation_files(year: int) -> list[str]:
    return [f"{kind}_{part}{year}.json" for kind in ("captions", "instances") for part in ("train", "val")]


def count_jpgs(folder: Path) -> int:
    """The ``.jpg`` files directly in ``folder`` (0 when it does not exist)."""
    if not folder.is_dir():
        return 0
    with os.scandir(folder) as entries:
        return sum(1 for entry in entries if entry.name.lower().endswith(".jpg") and entry.is_file())


@dataclass
class _Step:
    """One official zip and what is still to be done with it."""

    name: str                   # e.g. train2014.zip
    folder: str | None          # the image folder it unpacks to, None for annotations
    done: bool                  # unpacked and verified
    found: int = 0              # images (annotation files) in place
    download: int = 0           # bytes still to fetch
    zip_size: int = 0
    unpacked: int = 0


def _plan(root: Path, year: int) -> list[_Step]:
    """The zips of ``year`` (annotations, val, train), each marked done when its result is in place."""
    steps = []
    for name in (f"annotations_trainval{year}.zip", f"val{year}.zip", f"train{year}.zip"):
        archive = ARCHIVES[name]
        folder = None if name.startswith("annotations") else name.removesuffix(".zip")
        shutil.rmtree(root / f".{name}.unpacking", ignore_errors=True)      # left by an interrupted run
        if folder:
            shutil.rmtree(root / f".{folder}.incomplete", ignore_errors=True)
        if folder is None:
            found = sum((root / "annotations" / f).is_file() for f in annotation_files(year))
            done = found == len(annotation_files(year))
        else:
            found = count_jpgs(root / folder)
            if found > archive.images:
                raise CaptionerError(f"{root / folder}: {found:,} .jpg files, {archive.images:,} expected in {folder}; "
                                     "move the extra files away")
            done = found == archive.images
            if 0 < found < archive.images:
                log.info("%s: %s of %s images: incomplete, it will be unpacked again", root / folder,
                         f"{found:,}", f"{archive.images:,}")
        step = _Step(name, folder, done, found)
        if not done:
            zip_path, part = root / "downloads" / name, part_path(root / "downloads" / name)
            step.zip_size, step.unpacked = archive.size, archive.unpacked
            if zip_path.is_file():
                step.zip_size = zip_path.stat().st_size
                try:
                    with zipfile.ZipFile(zip_path) as handle:
                        step.unpacked = sum(info.file_size for info in handle.infolist())
                except (zipfile.BadZipFile, OSError):
                    pass            # found damaged when unpacked, and downloaded again
            else:
                step.download = max(archive.size - (part.stat().st_size if part.exists() else 0), 0)
        steps.append(step)
    return steps


def check_disk(root: Path, steps: list[_Step], keep_zips: bool, outputs: bool) -> int:
    """Refuse, as one line, a disk with less free space than the peak the remaining steps need; returns
    the bytes needed. ``outputs``: count :data:`OUTPUT_BYTES` for the split and output files too."""
    peak, in_use, items = 0, 0, []
    for step in (s for s in steps if not s.done):
        peak = max(peak, in_use + step.download + step.unpacked)
        kept = step.download if keep_zips else step.download - step.zip_size    # the zip goes once unpacked
        in_use += step.unpacked + kept
        zip_part = f"{step.name} {human_bytes(step.download)}" if step.download else f"{step.name} (downloaded)"
        items.append(f"{zip_part} + unpacked {human_bytes(step.unpacked)}")
    needed = peak + (OUTPUT_BYTES if outputs else 0)
    if outputs:
        items.append(f"split and output files {human_bytes(OUTPUT_BYTES)}")
    if not needed:
        return 0
    free = shutil.disk_usage(root).free
    if free < needed:
        how = "the zips kept" if keep_zips else "one after the other, each zip deleted once unpacked"
        raise CaptionerError(f"{root}: not enough free disk space: {human_bytes(needed)} needed, "
                             f"{human_bytes(free)} free ({how}: {', '.join(items)}); free some space or choose "
                             "another --root")
    return needed


# ---------------------------------------------------------------------------------------------- zips


def _unpack(zip_path: Path, root: Path, step: _Step) -> None:
    """Unpack ``zip_path`` into ``root`` through a temporary folder (see the module docstring)."""
    handle = open_zip(zip_path)
    tmp = root / f".{step.name}.unpacking"
    with handle:
        members = [info for info in handle.infolist() if not info.is_dir()]
        prefix = f"{step.folder or 'annotations'}/"
        strays = [info.filename for info in members if not info.filename.startswith(prefix)]
        if strays:
            raise CaptionerError(f"{zip_path}: holds {strays[0]} outside {prefix}: not COCO's {step.name} (delete it)")
        if step.folder:
            expected, found = ARCHIVES[step.name].images, sum(i.filename.lower().endswith(".jpg") for i in members)
            if found != expected:
                raise CaptionerError(f"{zip_path}: {found:,} .jpg images, {expected:,} expected: "
                                     f"not COCO's {step.name} (delete it)")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        log.info("unpacking %s (%s members)", zip_path, f"{len(members):,}")
        try:
            for info in members:        # reading a member to its end checks its CRC
                handle.extract(info, tmp)
        except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as err:
            shutil.rmtree(tmp, ignore_errors=True)
            raise Damaged(str(err)) from None
    if step.folder:
        found = count_jpgs(tmp / step.folder)
        if found != ARCHIVES[step.name].images:
            shutil.rmtree(tmp, ignore_errors=True)
            raise Damaged(f"{found:,} images unpacked, {ARCHIVES[step.name].images:,} expected")
        target, old = root / step.folder, root / f".{step.folder}.incomplete"
        if target.exists():
            os.replace(target, old)
        os.replace(tmp / step.folder, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        (root / "annotations").mkdir(exist_ok=True)
        for path in sorted((tmp / "annotations").iterdir()):
            os.replace(path, root / "annotations" / path.name)
    shutil.rmtree(tmp, ignore_errors=True)


def _fetch_zip(root: Path, step: _Step, keep_zips: bool) -> dict:
    """Download (resumably) and unpack one zip (:func:`~captioner.data.archives.fetch_zip`: a damaged one is deleted
    and downloaded once more)."""
    url, zip_path = zip_url(step.name), root / "downloads" / step.name
    downloaded = fetch_zip(url, zip_path, lambda path: _unpack(path, root, step))
    if not keep_zips:
        zip_path.unlink()
    return {"source": url, "downloaded_bytes": downloaded}


# ---------------------------------------------------------------------------------------------- Karpathy split


def check_karpathy(data: object) -> dict[str, int]:
    """``{split: images}`` of a Karpathy-format split whose content is COCO's Karpathy split: the counts of
    :data:`KARPATHY_COUNTS` (restval counted as train; so 123,287 distinct COCO ids in all), no id twice or
    in two splits, at least :data:`MIN_CAPTIONS` captions per image. Raises :class:`Rejected` saying what
    is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise Rejected("not a Karpathy split file (no 'images' list)")
    counts, seen, few = dict.fromkeys(KARPATHY_COUNTS, 0), {}, []
    for index, entry in enumerate(data["images"]):
        try:
            cocoid, split, sentences, _ = int(entry["cocoid"]), entry["split"], entry["sentences"], entry["filename"]
        except (KeyError, TypeError, ValueError):
            raise Rejected(f"images[{index}] lacks a cocoid, filename, split or sentences") from None
        split = "train" if split == "restval" else split
        if split not in counts:
            raise Rejected(f"images[{index}]: unknown split {split!r}")
        if cocoid in seen:
            raise Rejected(f"COCO id {cocoid} is in both {seen[cocoid]} and {split}" if seen[cocoid] != split
                           else f"COCO id {cocoid} is twice in {split}")
        seen[cocoid] = split
        if not isinstance(sentences, list) or not all(isinstance(s, dict) and isinstance(s.get("raw"), str)
                                                      for s in sentences):
            raise Rejected(f"images[{index}] (COCO id {cocoid}): sentences without 'raw' text")
        if len(sentences) < MIN_CAPTIONS:
            few.append((cocoid, len(sentences)))
        counts[split] += 1
    wrong = [f"{counts[s]:,} {'train+restval' if s == 'train' else s} images, {n:,} expected"
             for s, n in KARPATHY_COUNTS.items() if counts[s] != n]
    if wrong:
        raise Rejected(" and ".join(wrong))
    if few:
        raise Rejected(f"{len(few):,} images with fewer than {MIN_CAPTIONS} captions (COCO id {few[0][0]}: "
                       f"{few[0][1]})")
    return counts


def convert_blip(train: object, val: object, test: object) -> dict:
    """BLIP/LAVIS ``coco_karpathy_{train,val,test}.json`` lists in the Karpathy format (train: one entry per
    caption; val, test: one per image with a caption list). The COCO id is the number in the file name;
    every train image becomes split ``train`` (this source does not tell restval apart)."""
    images: dict[str, dict] = {}

    def add(path: object, split: str, captions: list, where: str) -> None:
        match = re.search(r"(\d+)\.jpg$", path) if isinstance(path, str) else None
        if match is None or not all(isinstance(c, str) for c in captions):
            raise Rejected(f"{where}: not a BLIP entry (an 'image' path ending in ID.jpg and caption text)")
        folder, _, filename = path.rpartition("/")
        entry = images.setdefault(path, {"filepath": folder, "filename": filename, "cocoid": int(match.group(1)),
                                         "split": split, "sentences": []})
        if entry["split"] != split:
            raise Rejected(f"{path} is in both {entry['split']} and {split}")
        entry["sentences"].extend({"raw": caption} for caption in captions)

    for name, items in (("train", train), ("val", val), ("test", test)):
        if not isinstance(items, list):
            raise Rejected(f"coco_karpathy_{name}.json: a list of entries expected, got {type(items).__name__}")
        for k, item in enumerate(items):
            where = f"coco_karpathy_{name}.json[{k}]"
            if not isinstance(item, dict):
                raise Rejected(f"{where}: not an object")
            caption = item.get("caption")
            if name == "train":
                add(item.get("image"), "train", [caption], where)
            elif isinstance(caption, list):
                add(item.get("image"), name, caption, where)
            else:
                raise Rejected(f"{where}: 'caption' must be a list of captions")
    return {"dataset": "coco", "source": "BLIP/LAVIS coco_karpathy_{train,val,test}.json, converted by captioner",
            "images": list(images.values())}


def _load_local(path: Path) -> tuple[dict, bytes | None]:
    """``(split data, its original bytes or None)`` of a split file given by hand: ``dataset_coco.json``, a
    ``caption_datasets.zip`` or the folder of BLIP's three files."""
    if path.is_dir():
        blip = [path / f"coco_karpathy_{part}.json" for part in ("train", "val", "test")]
        if all(p.is_file() for p in blip):
            return convert_blip(*(read_json(p) for p in blip)), None
        if (path / "dataset_coco.json").is_file():
            path = path / "dataset_coco.json"
        else:
            raise Rejected("a folder with neither dataset_coco.json nor coco_karpathy_{train,val,test}.json")
    if not path.is_file():
        raise Rejected("not found")
    if zipfile.is_zipfile(path):
        return _from_zip(path)
    raw = path.read_bytes()
    data = read_json(path)
    if isinstance(data, list):
        raise Rejected("one BLIP file: pass the folder that holds all three coco_karpathy_{train,val,test}.json")
    return data, raw


def _from_zip(path: Path) -> tuple[dict, bytes]:
    try:
        with zipfile.ZipFile(path) as handle:
            members = [n for n in handle.namelist() if n.rsplit("/", 1)[-1] == "dataset_coco.json"]
            if not members:
                raise Rejected("the zip holds no dataset_coco.json")
            raw = handle.read(members[0])
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise Rejected(f"damaged zip ({err})") from None
    try:
        return json.loads(raw), raw
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise Rejected(f"dataset_coco.json is not JSON ({err})") from None


def _fetch_source(source: KarpathySource, downloads: Path) -> tuple[dict, bytes | None, list[Path]]:
    """``(split data, original bytes or None, the files downloaded)`` of one of :data:`KARPATHY_SOURCES`."""
    files = [download(url, downloads / url.rsplit("/", 1)[-1]) for url in source.urls]
    try:
        if source.kind == "karpathy_zip":
            return (*_from_zip(files[0]), files)
        if source.kind == "blip":
            return convert_blip(*(read_json(f) for f in files)), None, files
    except (Rejected, CaptionerError):
        for path in files:      # not the split (an error page, say): no use keeping it
            path.unlink(missing_ok=True)
        raise
    raise CaptionerError(f"KARPATHY_SOURCES: unknown kind {source.kind!r} of {source.name}")


def obtain_karpathy(root: str | Path, karpathy_file: str | Path | None = None, keep_downloads: bool = False) -> dict:
    """The Karpathy split as ``ROOT/dataset_coco_karpathy.json``, from the first source that passes
    :func:`check_karpathy`: ``karpathy_file``, the file already there, then :data:`KARPATHY_SOURCES`.
    Returns ``{"data", "source", "counts", "reused"}`` (reused: the file already there). When every source fails,
    one line names each with the reason."""
    root = Path(root)
    target, downloads = root / KARPATHY_FILE, root / "downloads"
    candidates = []             # (name, load, whether it is the target itself)
    if karpathy_file:
        candidates.append((f"--karpathy-file {karpathy_file}", lambda: (*_load_local(Path(karpathy_file)), []), False))
    if target.is_file():
        candidates.append((f"{target} (already there)", lambda: (read_json(target), None, []), True))
    for source in KARPATHY_SOURCES:
        candidates.append((f"{source.name} ({', '.join(source.urls)})",
                           lambda source=source: _fetch_source(source, downloads), False))
    failures = []
    for name, load, reused in candidates:
        files: list[Path] = []
        try:
            data, raw, files = load()
            counts = check_karpathy(data)
        except DownloadError as err:
            failures.append(f"{name}: {err.reason}")
        except (Rejected, CaptionerError) as err:
            failures.append(f"{name}: {err}")
            for path in files:      # a file of the wrong content: no use keeping it
                path.unlink(missing_ok=True)
        else:
            if not reused:
                write_file(target, raw if raw is not None else json.dumps(data))
            if not keep_downloads:
                for path in files:
                    path.unlink(missing_ok=True)
            log.info("Karpathy split: %s (%s)", name, ", ".join(f"{n:,} {s}" for s, n in counts.items()))
            return {"data": data, "source": name, "counts": counts, "reused": reused}
        log.warning("Karpathy split: %s", failures[-1])
    raise CaptionerError("no usable Karpathy split: " + "; ".join(failures) + f"; {BY_HAND}, or copy it to {target}")


# ---------------------------------------------------------------------------------------------- outputs


def _image_folders(root: Path, year: int) -> dict[int, tuple[str, str]]:
    """``{COCO id: (folder, file name)}`` of the year's train and val images (from the captions files)."""
    where = {}
    for part in ("train", "val"):
        path = root / "annotations" / f"captions_{part}{year}.json"
        data = read_json(path)
        try:
            for image in data["images"]:
                where[int(image["id"])] = (f"{part}{year}", image["file_name"])
        except (KeyError, TypeError, ValueError):
            raise CaptionerError(f"{path}: not a COCO captions file (images without id or file_name)") from None
    return where


def map_to_year(images: list[dict], folders: dict[int, tuple[str, str]], year: int) -> list[dict]:
    """The Karpathy entries with the file path and name of ``year``'s copy of each photo, by COCO id."""
    missing = [entry["cocoid"] for entry in images if int(entry["cocoid"]) not in folders]
    if missing:
        raise CaptionerError(f"{len(missing):,} of the Karpathy split's {len(images):,} images are not among the "
                             f"{year} images (COCO id {missing[0]}{', ...' if len(missing) > 1 else ''})")
    out = []
    for entry in images:
        folder, name = folders[int(entry["cocoid"])]
        out.append({**entry, "filepath": folder, "filename": name, "cocoid": int(entry["cocoid"])})
    return out


def official_split(root: str | Path, year: int = 2017) -> list[dict]:
    """The official split in the Karpathy format: train = train{year} less :data:`HELD_OUT` images drawn
    with :data:`HELD_OUT_SEED` from its sorted ids, val = those, test = val{year}; captions from
    ``annotations/captions_{train,val}{year}.json``."""
    root, out = Path(root), []
    for part in ("train", "val"):
        path = root / "annotations" / f"captions_{part}{year}.json"
        data = read_json(path)
        try:
            captions: dict[int, list[str]] = {}
            for ann in data["annotations"]:
                captions.setdefault(int(ann["image_id"]), []).append(ann["caption"])
            images = sorted(data["images"], key=lambda image: int(image["id"]))
            ids = [int(image["id"]) for image in images]
            names = [image["file_name"] for image in images]
        except (KeyError, TypeError, ValueError):
            raise CaptionerError(f"{path}: not a COCO captions file") from None
        if part == "train":
            if len(ids) <= HELD_OUT:
                raise CaptionerError(f"{path}: {len(ids):,} images, too few to hold {HELD_OUT:,} out as val")
            held = set(random.Random(HELD_OUT_SEED).sample(ids, HELD_OUT))
        uncaptioned = 0
        for image_id, name in zip(ids, names):
            if not captions.get(image_id):
                uncaptioned += 1
                continue
            split = ("val" if image_id in held else "train") if part == "train" else "test"
            out.append({"filepath": f"{part}{year}", "filename": name, "cocoid": image_id, "split": split,
                        "sentences": [{"raw": c} for c in captions[image_id]]})
        if uncaptioned:
            log.warning("%s: %d images without captions left out", path, uncaptioned)
    order = {"train": 0, "val": 1, "test": 2}
    return sorted(out, key=lambda entry: order[entry["split"]])


def write_instances(root: Path, year: int, images: list[dict], out: Path) -> dict:
    """``out``: the COCO instances (images, annotations, categories) of the val and test images of
    ``images`` (Karpathy entries with the year's file paths), from ``annotations/instances_*{year}.json``."""
    wanted: dict[str, set[int]] = {}
    for entry in images:
        if entry["split"] in ("val", "test"):
            wanted.setdefault(entry["filepath"], set()).add(int(entry["cocoid"]))
    result: dict = {"info": {"description": f"COCO {year} instances of the val and test images of "
                                            f"dataset_coco.json (captioner data coco)"},
                    "images": [], "annotations": [], "categories": None}
    for folder, ids in sorted(wanted.items()):
        path = root / "annotations" / f"instances_{folder}.json"
        data = read_json(path)
        if not isinstance(data, dict) or not all(k in data for k in ("images", "annotations", "categories")):
            raise CaptionerError(f"{path}: not a COCO instances file (images, annotations, categories)")
        found = [image for image in data["images"] if image.get("id") in ids]
        if len(found) != len(ids):
            raise CaptionerError(f"{path}: {len(ids) - len(found):,} of the {len(ids):,} val/test images from "
                                 f"{folder} are not in it")
        result["images"] += found
        result["annotations"] += [a for a in data["annotations"] if a.get("image_id") in ids]
        result["categories"] = result["categories"] or data["categories"]
    result["categories"] = result["categories"] or []
    write_file(out, json.dumps(result))
    return {"images": len(result["images"]), "annotations": len(result["annotations"])}


def _digest(paths: list[Path]) -> dict[str, str]:
    return {path.name: file_sha256(path) for path in paths}


def _outputs_current(root: Path, previous: dict, settings: dict, inputs: dict) -> bool:
    """Whether the outputs in ``root`` are those ``coco_setup.json`` records for these settings and inputs."""
    if not previous or previous.get("settings") != settings or previous.get("inputs") != inputs:
        return False
    recorded = previous.get("outputs") or {}
    return set(recorded) == set(OUTPUTS) and all((root / name).is_file() and file_sha256(root / name) == digest
                                                  for name, digest in recorded.items())


def _write_outputs(root: Path, year: int, split: str, images: list[dict]) -> dict:
    """dataset_coco.json, instances_valtest.json and vocab.json; returns counts and the vocabulary report."""
    from captioner.data.config import DataConfig
    from captioner.data.vocabulary import vocabulary_report

    write_file(root / "dataset_coco.json", json.dumps({"dataset": "coco", "year": year, "split": split,
                                                       "images": images}))
    instances = write_instances(root, year, images, root / "instances_valtest.json")
    data = DataConfig(format="karpathy", karpathy=str(root / "dataset_coco.json"), image_root=str(root),
                      restval="train", vocab=str(root / "vocab.json"), vocab_min_count=VOCAB_MIN_COUNT,
                      max_caption_length=MAX_CAPTION_LENGTH)
    vocabulary = vocabulary_report(data)
    counts = {}
    for entry in images:
        name = "train" if entry["split"] == "restval" else entry["split"]
        count = counts.setdefault(name, {"images": 0, "captions": 0})
        count["images"] += 1
        count["captions"] += len(entry["sentences"])
    return {"counts": {s: counts.get(s, {"images": 0, "captions": 0}) for s in ("train", "val", "test")},
            "instances": instances, "vocabulary": vocabulary}


# ---------------------------------------------------------------------------------------------- the command


def _check_setup_arguments(year: int, split: str, karpathy_file: str | Path | None) -> None:
    """Refuse a year, split or split file that do not go together, before anything is downloaded."""
    if year not in (2014, 2017):
        raise CaptionerError(f"--year {year}: COCO captions come in 2014 and 2017")
    if split not in ("karpathy", "official"):
        raise CaptionerError(f"--split {split}: karpathy or official")
    if split == "official" and year != 2017:
        raise CaptionerError(f"--split official is the 2017 split (train2017 less {HELD_OUT:,} held-out images, "
                             "val2017 as test): pass --year 2017, or use --split karpathy with 2014")
    if karpathy_file and split != "karpathy":
        raise CaptionerError("--karpathy-file is for --split karpathy; --split official needs no split file")


def _run_step(root: Path, step, year: int, keep_zips: bool, result: dict) -> None:
    """Verify or fetch and unpack one zip of the plan (:func:`_plan`), recording what it did in ``result``."""
    key = step.folder or "annotations"
    if step.done:
        result["images"][key] = {"status": "verified", "count": step.found}
        return
    fetched = _fetch_zip(root, step, keep_zips)
    result["downloaded_bytes"] += fetched["downloaded_bytes"]
    found = count_jpgs(root / step.folder) if step.folder else len(annotation_files(year))
    result["images"][key] = {"status": "unpacked", "count": found, "source": fetched["source"]}


def setup_coco(root: str | Path, year: int = 2014, split: str = "karpathy", keep_zips: bool = False,
               karpathy_file: str | Path | None = None) -> dict:
    """Run the steps of the module docstring in ``root``; returns what each did (see :func:`format_summary`)."""
    _check_setup_arguments(year, split, karpathy_file)
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise CaptionerError(f"{root}: a file, not a folder (--root)")
    root.mkdir(parents=True, exist_ok=True)
    previous = read_record(root / RECORD)

    steps = _plan(root, year)
    needed = check_disk(root, steps, keep_zips, outputs=not previous)
    result: dict = {"root": str(root), "year": year, "split": split, "needed_bytes": needed, "images": {},
                    "downloaded_bytes": 0}

    if split == "karpathy":
        karpathy = obtain_karpathy(root, karpathy_file, keep_downloads=keep_zips)
        source = karpathy["source"]
        if karpathy["reused"]:      # kept from an earlier run: say where it came from
            source = (previous.get("sources") or {}).get("split", source)
        result["split_source"] = source

    for step in steps:
        _run_step(root, step, year, keep_zips, result)
    leftover = [root / "downloads" / s.name for s in steps if s.done and (root / "downloads" / s.name).is_file()]
    if leftover and not keep_zips:
        result["leftover_zips"] = [str(p) for p in leftover]

    captions = [root / "annotations" / f"captions_{part}{year}.json" for part in ("train", "val")]
    inputs = _digest(([root / KARPATHY_FILE] if split == "karpathy" else []) + captions)
    settings = {"version": SETUP_VERSION, "year": year, "split": split, "vocab_min_count": VOCAB_MIN_COUNT,
                "max_caption_length": MAX_CAPTION_LENGTH, "held_out": HELD_OUT if split == "official" else None}
    if _outputs_current(root, previous, settings, inputs):
        result.update(outputs="verified", counts=previous["counts"], sources=previous.get("sources", {}))
        return result

    if split == "karpathy":
        images = map_to_year(karpathy["data"]["images"], _image_folders(root, year), year)
    else:
        images = official_split(root, year)
        result["split_source"] = (f"official {year} captions; val: {HELD_OUT:,} train{year} images held out "
                                  f"(seed {HELD_OUT_SEED})")
    written = _write_outputs(root, year, split, images)
    sources = {"split": result["split_source"],
               **{key: info.get("source", (previous.get("sources") or {}).get(key, "already in place"))
                  for key, info in result["images"].items()}}
    record = {"year": year, "split": split, "counts": written["counts"], "sources": sources,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "settings": settings,
              "inputs": inputs, "outputs": _digest([root / name for name in OUTPUTS]),
              "instances_valtest": written["instances"], "vocabulary": written["vocabulary"]}
    write_file(root / RECORD, json.dumps(record, indent=2))
    result.update(outputs="written", counts=written["counts"], sources=sources, vocabulary=written["vocabulary"])
    return result


def next_commands(root: str | Path) -> list[str]:
    """The commands after the setup, with the ``data.*`` overrides a root other than ``data/coco`` needs."""
    root = Path(root)
    overrides = ""
    if root.resolve() != CONFIG_ROOT.resolve():
        instances = str(root / "instances_valtest.json")
        overrides = " " + " ".join(shlex.quote(o) for o in (
            f"data.karpathy={root / 'dataset_coco.json'}", f"data.image_root={root}",
            f"data.vocab={root / 'vocab.json'}",
            "data.instances=" + json.dumps({"val": instances, "test": instances}),
            f"data.features={root / 'features_vgg19'}"))
    return [f"captioner train coco_soft{overrides}",
            f"captioner cache-features coco_soft{overrides}"]


def format_summary(result: dict) -> str:
    """What :func:`setup_coco` did, in a few lines, then the next commands."""
    counts = result["counts"]
    lines = [f"MS-COCO {result['year']}, {result['split']} split, in {result['root']}:"]
    for key, info in result["images"].items():
        what = "annotation files" if key == "annotations" else "images"
        lines.append(f"  {key}: {info['count']:,} {what}, "
                     + ("already in place (verified)" if info["status"] == "verified" else "downloaded and unpacked"))
    lines.append("  split: " + ", ".join(f"{s} {c['images']:,} images ({c['captions']:,} captions)"
                                         for s, c in counts.items()))
    lines.append(f"  split from: {result.get('sources', {}).get('split', result.get('split_source'))}")
    if result["outputs"] == "verified":
        lines.append(f"  {', '.join(OUTPUTS)}, {RECORD}: up to date (verified)")
    else:
        lines.append(f"  wrote {', '.join(OUTPUTS)} ({result['vocabulary']['words']:,} words), {RECORD}")
    downloaded = result["downloaded_bytes"]
    lines.append(f"  downloaded {human_bytes(downloaded)}" if downloaded else
                 "  nothing downloaded" + ("; everything was in place and verified" if result["outputs"] == "verified"
                                           else ""))
    for path in result.get("leftover_zips", []):
        lines.append(f"  {path} is no longer needed (the folder is complete): delete it to free the space")
    train, cache = next_commands(result["root"])
    cache_bytes = sum(c["images"] for c in counts.values()) * VGG19_FEATURE_BYTES
    lines += [f"next: train (it caches the VGG-19 features of every image first, {human_bytes(cache_bytes)}, "
              "resumable):",
              f"  {train}", "  or, before several GPUs with torchrun, cache them on their own first:", f"  {cache}"]
    return "\n".join(lines)

