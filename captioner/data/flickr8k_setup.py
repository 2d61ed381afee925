"""Flickr8k from an empty folder to the files the Flickr8k recipes read (``captioner data flickr8k``).

The photos and captions of Hodosh, Young & Hockenmaier (2013) with the dataset's official split, the lists
``Flickr_8k.{train,dev,test}Images.txt`` (6,000 / 1,000 / 1,000 photos; dev becomes ``val``), laid out as::

    ROOT/images/NAME.jpg          the photos (the archive's folder Flicker8k_Dataset, sic)
    ROOT/text/*.txt               the archive's caption and split files (Flickr8k.token.txt, ...)
    ROOT/dataset_flickr8k.json    the split in Karpathy's format (the recipes' data.karpathy; data.image_root: ROOT)
    ROOT/annotations/captions_{train,val,test}.json
                                  each split in COCO's captions format, image ids those captioner evaluate's
                                  captions_SPLIT.json use (for pycocoevalcap, or data.format=coco)
    ROOT/flickr8k_setup.json      counts, what was skipped, sources and digests

The photos and text come from ``source`` (``--from``, no network): a folder with the two archives, with their
unpacked contents (``Flicker8k_Dataset/`` and the text files), or with photos and a Karpathy-format
``dataset_flickr8k.json`` (its split then taken as it is); otherwise from the two archives of :data:`RELEASE`,
downloaded resumably and checked against :data:`MD5`. Folders are filled under a temporary name and renamed when
complete; each step is skipped when its result is in place, so a second run downloads and rewrites nothing. Names
the caption file or a split list gets wrong (captions of a name that is no photo, a listed name without a photo or
without captions) are skipped and counted, never fatal.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from captioner.core.files import file_sha256, read_json, read_record, write_file
from captioner.data.archives import Damaged, check_md5, extract_member, fetch_zip, human_bytes, open_zip, zip_files
from captioner.data.text import has_words, tokenize
from captioner.errors import CaptionerError

RELEASE = "https://github.com/jbrownlee/Datasets/releases/download/Flickr8k"   # the mirror tutorials download from
IMAGES_ZIP, TEXT_ZIP = "Flickr8k_Dataset.zip", "Flickr8k_text.zip"
# The MD5s published for these two files in mlverse/torchvision, R/dataset-flickr.R (flickr8k_caption_dataset).
MD5 = {IMAGES_ZIP: "f18a1e2920de5bd84dae7cf08ec78978", TEXT_ZIP: "bf6c1abcb8e4a833b7f922104de18627"}
ZIP_BYTES = {IMAGES_ZIP: 1_120_000_000, TEXT_ZIP: 2_400_000}     # about; the disk check's estimate
IMAGE_FOLDERS = ("Flicker8k_Dataset", "Flickr8k_Dataset")       # the archive's spelling, then the zip's
TOKEN_FILE = "Flickr8k.token.txt"
SPLIT_LISTS = {"train": "Flickr_8k.trainImages.txt", "val": "Flickr_8k.devImages.txt",
               "test": "Flickr_8k.testImages.txt"}
TEXT_FILES = (TOKEN_FILE, *SPLIT_LISTS.values())
SPLITS = ("train", "val", "test")
KARPATHY = "dataset_flickr8k.json"
COCO_CAPTIONS = "annotations/captions_{}.json"      # under ROOT, one per split
RECORD = "flickr8k_setup.json"
FIRST_RECIPE = "flickr8k_full_soft_lite2"     # the recipe the next commands train (the README's)
CONFIG_ROOT = Path("data/flickr8k")     # the root the Flickr8k recipes name
SETUP_VERSION = 2                       # in flickr8k_setup.json; bump when the outputs change
SHOWN = 3                               # names shown of each kind skipped


@dataclass
class Skipped:
    """What the split leaves out, by kind: names (shown: the first :data:`SHOWN`) and counts."""

    captions_without_photo: list[str] = field(default_factory=list)   # caption-file names that are no photo
    orphan_captions: int = 0                                           # the captions of those names
    listed_without_photo: list[str] = field(default_factory=list)
    listed_without_captions: list[str] = field(default_factory=list)
    listed_twice: list[str] = field(default_factory=list)
    empty_captions: int = 0                                            # captions without a word
    malformed: int = 0                                                 # lines or entries that cannot be read

    def as_dict(self) -> dict:
        return {"captions_without_photo": {"names": len(self.captions_without_photo),
                                           "captions": self.orphan_captions,
                                           "shown": self.captions_without_photo[:SHOWN]},
                **{kind: {"names": len(names), "shown": names[:SHOWN]}
                   for kind, names in (("listed_without_photo", self.listed_without_photo),
                                       ("listed_without_captions", self.listed_without_captions),
                                       ("listed_twice", self.listed_twice))},
                "empty_captions": self.empty_captions, "malformed": self.malformed}


# ---------------------------------------------------------------------------------------------- folders


def _photos(folder: Path) -> set[str]:
    """The names of the ``.jpg`` files directly in ``folder`` (none when it does not exist)."""
    if not folder.is_dir():
        return set()
    with os.scandir(folder) as entries:
        return {e.name for e in entries if e.name.lower().endswith(".jpg") and not e.name.startswith(".")
                and e.is_file()}


def _fresh(folder: Path) -> Path:
    """An empty temporary folder (what an interrupted run left there removed)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _into_place(tmp: Path, target: Path) -> None:
    """The complete folder ``tmp`` renamed to ``target``, replacing what was there."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def _link_or_copy(source: Path, dest: Path) -> None:
    """``dest`` as a hard link to ``source``, or a copy (through a temporary name) where links cannot be made."""
    try:
        os.link(source, dest)
    except OSError:
        part = dest.with_name(f".{dest.name}.part")
        shutil.copyfile(source, part)
        os.replace(part, dest)


def place_photos(sources: dict[str, Path], root: Path) -> str:
    """The photos ``{name: path}`` in ``ROOT/images``: linked or copied into a temporary folder renamed into place,
    or, into an ``images`` folder already there, only those it lacks. Returns what was done."""
    target = root / "images"
    if sources and all(path.parent.resolve() == target.resolve() for path in sources.values()):
        return f"in place ({len(sources):,} photos)"
    if target.is_dir():
        missing = {name: path for name, path in sources.items() if not (target / name).is_file()}
        for name, path in missing.items():
            _link_or_copy(path, target / name)
        return f"{len(missing):,} photos added" if missing else "already in place (verified)"
    tmp = _fresh(root / ".images.unpacking")
    for name, path in sources.items():
        _link_or_copy(path, tmp / name)
    _into_place(tmp, target)
    return f"{len(sources):,} photos linked or copied"


# ---------------------------------------------------------------------------------------------- archives


def _in_image_folder(name: str) -> bool:
    path = PurePosixPath(name.replace("\\", "/"))
    return path.parent.name in IMAGE_FOLDERS and path.suffix.lower() == ".jpg"


def unpack_images(zip_path: Path, root: Path) -> None:
    """The ``.jpg`` photos of ``Flickr8k_Dataset.zip`` (those in its ``Flicker8k_Dataset/``) into ``ROOT/images``
    through a temporary folder; :class:`~captioner.data.archives.Damaged` when a member cannot be read."""
    with open_zip(zip_path) as handle:
        members = [info for info in zip_files(handle, zip_path) if _in_image_folder(info.filename)]
        if not members:
            raise CaptionerError(f"{zip_path}: no .jpg photos in a folder {IMAGE_FOLDERS[0]}/: not Flickr8k's "
                                 f"{IMAGES_ZIP}")
        tmp = _fresh(root / ".images.unpacking")
        try:
            for info in members:
                extract_member(handle, info, tmp / PurePosixPath(info.filename.replace("\\", "/")).name)
        except Damaged:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    _into_place(tmp, root / "images")


def unpack_text(zip_path: Path, root: Path) -> None:
    """The ``.txt`` files of ``Flickr8k_text.zip`` into ``ROOT/text`` through a temporary folder; one line when the
    caption file or a split list is not in it."""
    with open_zip(zip_path) as handle:
        members = {PurePosixPath(info.filename.replace("\\", "/")).name: info
                   for info in zip_files(handle, zip_path) if info.filename.lower().endswith(".txt")}
        absent = [name for name in TEXT_FILES if name not in members]
        if absent:
            raise CaptionerError(f"{zip_path}: no {', '.join(absent)} in it: not Flickr8k's {TEXT_ZIP}")
        tmp = _fresh(root / ".text.unpacking")
        try:
            for name, info in members.items():
                extract_member(handle, info, tmp / name)
        except Damaged:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    _into_place(tmp, root / "text")


def _check_disk(root: Path, names: list[str]) -> None:
    """One line when the disk lacks the room for the archives ``names`` still to fetch and their contents."""
    needed = sum(ZIP_BYTES[name] for name in names) + (ZIP_BYTES[IMAGES_ZIP] if IMAGES_ZIP in names else 0)
    free = shutil.disk_usage(root).free
    if needed and free < needed:
        raise CaptionerError(f"{root}: not enough free disk space: about {human_bytes(needed)} needed (the archives "
                             f"and the photos unpacked), {human_bytes(free)} free; free some space or choose "
                             "another --root")


def download_archives(root: Path, keep_zips: bool, result: dict) -> None:
    """Fetch, check and unpack the archives whose contents are not in ``root`` yet (``ROOT/text``,
    ``ROOT/images``), recording in ``result`` what each step did."""
    done = {TEXT_ZIP: all((root / "text" / name).is_file() for name in TEXT_FILES),
            IMAGES_ZIP: (root / "images").is_dir()}
    _check_disk(root, [name for name, finished in done.items() if not finished])
    for name, unpack, key in ((TEXT_ZIP, unpack_text, "text"), (IMAGES_ZIP, unpack_images, "images")):
        if done[name]:
            result["steps"][key] = "already in place (verified)"
            continue
        url, zip_path = f"{RELEASE}/{name}", root / "downloads" / name
        result["downloaded_bytes"] += fetch_zip(url, zip_path, lambda path, unpack=unpack: unpack(path, root),
                                                MD5[name])
        if not keep_zips:
            zip_path.unlink()
        result["steps"][key] = f"downloaded from {url} and unpacked"


# ---------------------------------------------------------------------------------------------- --from


def _find(source: Path, match) -> Path | None:
    """The first path in ``source`` or up to two folders below it (sorted, ``__MACOSX`` left out) that ``match``es."""
    level = [source]
    for _ in range(3):
        for path in level:
            if match(path):
                return path
        level = sorted(child for path in level if path.is_dir() for child in path.iterdir()
                       if child.is_dir() and child.name != "__MACOSX")
    return None


def _local_zip(path: Path, unpack, root: Path) -> None:
    """A user's archive checked against its published MD5 and unpacked (never deleted)."""
    try:
        check_md5(path, MD5[path.name])
        unpack(path, root)
    except Damaged as err:
        raise CaptionerError(f"{path}: {err}: a damaged or different copy of Flickr8k's {path.name}") from None


def from_local(root: Path, source: Path, result: dict) -> Path | None:
    """Take the photos and text from a local folder (see the module docstring) into ``root``; returns the
    Karpathy file to take the split from, or None (the official text files are in ``ROOT/text``)."""
    if not source.is_dir():
        raise CaptionerError(f"{source}: not a folder (--from: the folder with Flickr8k's two archives, their "
                             f"contents, or photos with a {KARPATHY})")
    if (source / KARPATHY).is_file():
        result["steps"]["text"] = f"the {KARPATHY} of {source}"
        return source / KARPATHY
    text_zip, images_zip = source / TEXT_ZIP, source / IMAGES_ZIP
    token = None if text_zip.is_file() else _find(source, lambda path: (path / TOKEN_FILE).is_file())
    if not text_zip.is_file() and token is None:
        raise CaptionerError(f"{source}: neither {KARPATHY}, {TEXT_ZIP} nor {TOKEN_FILE} in it (--from: the folder "
                             f"with Flickr8k's two archives, their contents, or photos with a {KARPATHY})")
    if all((root / "text" / name).is_file() for name in TEXT_FILES):
        result["steps"]["text"] = "already in place (verified)"
    elif token is None:
        _local_zip(text_zip, unpack_text, root)
        result["steps"]["text"] = f"unpacked from {text_zip}"
    else:
        absent = [name for name in SPLIT_LISTS.values() if not (token / name).is_file()]
        if absent:
            raise CaptionerError(f"{token}: {TOKEN_FILE} without {', '.join(absent)} beside it")
        tmp = _fresh(root / ".text.unpacking")
        for name in TEXT_FILES:
            shutil.copyfile(token / name, tmp / name)
        _into_place(tmp, root / "text")
        result["steps"]["text"] = f"copied from {token}"
    if (root / "images").is_dir():
        result["steps"]["images"] = "already in place (verified)"
    elif images_zip.is_file():
        _local_zip(images_zip, unpack_images, root)
        result["steps"]["images"] = f"unpacked from {images_zip}"
    else:
        folder = _find(source, lambda path: path.name in IMAGE_FOLDERS and bool(_photos(path)))
        if folder is None:
            raise CaptionerError(f"{source}: neither {IMAGES_ZIP} nor a folder {IMAGE_FOLDERS[0]} of .jpg photos in it")
        result["steps"]["images"] = place_photos({name: folder / name for name in _photos(folder)}, root)
    return None


# ---------------------------------------------------------------------------------------------- the split


def _lines(path: Path) -> list[str]:
    try:
        return path.read_bytes().decode("utf-8", errors="replace").splitlines()
    except OSError as err:
        raise CaptionerError(f"{path}: cannot read ({err.strerror})") from None


def read_captions(path: Path, skipped: Skipped) -> dict[str, list[str]]:
    """``{name: captions in the order of their #k}`` of ``Flickr8k.token.txt`` (``NAME.jpg#k<TAB>caption`` per line);
    lines of another form are counted in ``skipped``."""
    numbered: dict[str, list[tuple[int, str]]] = {}
    for line in _lines(path):
        if not line.strip():
            continue
        key, tab, caption = line.partition("\t")
        name, hash_mark, k = key.strip().rpartition("#")
        if not tab or not hash_mark or not k.isdigit() or not name:
            skipped.malformed += 1
            continue
        numbered.setdefault(name, []).append((int(k), caption.strip()))
    return {name: [caption for _, caption in sorted(pairs)] for name, pairs in numbered.items()}


def _entry(name: str, split: str, captions: list[str], imgid: int, sentid: int) -> dict:
    sentids = list(range(sentid, sentid + len(captions)))
    return {"filepath": "images", "filename": name, "imgid": imgid, "split": split,
            "sentences": [{"raw": c, "tokens": tokenize(c), "imgid": imgid, "sentid": s}
                          for c, s in zip(captions, sentids)],
            "sentids": sentids}


def official_split(text: Path, photos: set[str], skipped: Skipped) -> list[dict]:
    """The Karpathy-format entries of the official split: each list's names that are photos with captions, sorted
    by name within a split, train then val then test; everything else counted in ``skipped``."""
    captions = read_captions(text / TOKEN_FILE, skipped)
    chosen: dict[str, str] = {}
    kept: dict[str, list[tuple[str, list[str]]]] = {split: [] for split in SPLITS}
    for split, listing in SPLIT_LISTS.items():
        for name in (line.strip() for line in _lines(text / listing)):
            if not name:
                continue
            if name in chosen:
                skipped.listed_twice.append(name)
                continue
            chosen[name] = split
            if name not in photos:
                skipped.listed_without_photo.append(name)
                continue
            good = [c for c in captions.get(name, []) if has_words(c)]
            skipped.empty_captions += len(captions.get(name, [])) - len(good)
            if not good:
                skipped.listed_without_captions.append(name)
                continue
            kept[split].append((name, good))
    for name in sorted(set(captions) - photos):
        skipped.captions_without_photo.append(name)
        skipped.orphan_captions += len(captions[name])
    entries, sentid = [], 0
    for split in SPLITS:
        for name, good in sorted(kept[split]):
            entries.append(_entry(name, split, good, len(entries), sentid))
            sentid += len(good)
    return entries


def karpathy_split(path: Path, skipped: Skipped) -> tuple[list[dict], dict[str, Path]]:
    """``(entries, {name: photo path})`` of a Karpathy-format file: its entries whose photo is beside it (under
    their ``filepath``) with captions that have words, their ``filepath`` made ``images``; the rest counted in
    ``skipped``."""
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise CaptionerError(f"{path}: not a Karpathy split file (no 'images' list)")
    entries, sources = [], {}
    for entry in data["images"]:
        try:
            name, split, sentences = entry["filename"], entry["split"], list(entry["sentences"])
            photo = path.parent / entry.get("filepath", "") / name
        except (KeyError, TypeError):
            skipped.malformed += 1
            continue
        if not isinstance(name, str) or split not in (*SPLITS, "restval"):
            skipped.malformed += 1
        elif name in sources:
            skipped.listed_twice.append(name)
        elif not photo.is_file():
            skipped.listed_without_photo.append(name)
        else:
            good = [s for s in sentences
                    if isinstance(s, dict) and isinstance(s.get("raw"), str) and has_words(s["raw"])]
            skipped.empty_captions += len(sentences) - len(good)
            if not good:
                skipped.listed_without_captions.append(name)
                continue
            sources[name] = photo
            entries.append({**entry, "filepath": "images", "sentences": good}
                           | ({"sentids": [s["sentid"] for s in good if "sentid" in s]} if len(good) < len(sentences)
                              else {}))
    return entries, sources


def coco_captions(entries: list[dict], split: str) -> dict:
    """The photos of ``split`` among Karpathy ``entries`` (restval counted as train) in COCO's captions format: an
    image per photo, its ``id`` the image id the readers give it (``cocoid``, else ``imgid``, else its place), and an
    annotation per caption."""
    images, annotations = [], []
    for index, entry in enumerate(entries):
        if ("train" if entry["split"] == "restval" else entry["split"]) != split:
            continue
        image_id = int(entry.get("cocoid", entry.get("imgid", index)))
        images.append({"id": image_id, "file_name": entry["filename"]})
        annotations += [{"id": len(annotations) + k + 1, "image_id": image_id, "caption": sentence["raw"]}
                        for k, sentence in enumerate(entry["sentences"])]
    return {"info": {"description": f"Flickr8k, {split} split (captioner data flickr8k)"}, "images": images,
            "annotations": annotations, "type": "captions", "licenses": []}


def split_counts(entries: list[dict]) -> dict[str, dict[str, int]]:
    """``{split: {"images", "captions"}}`` of Karpathy entries (restval counted as train)."""
    counts = {split: {"images": 0, "captions": 0} for split in SPLITS}
    for entry in entries:
        count = counts["train" if entry["split"] == "restval" else entry["split"]]
        count["images"] += 1
        count["captions"] += len(entry["sentences"])
    return counts


# ---------------------------------------------------------------------------------------------- the command


def _names_digest(names: set[str]) -> str:
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()


def _outputs_current(root: Path, previous: dict, inputs: dict | None) -> bool:
    """Whether ``ROOT/dataset_flickr8k.json`` is the one ``flickr8k_setup.json`` records, made from ``inputs``
    (None: whatever they were), with every photo it names in ``ROOT/images``."""
    outputs = previous.get("outputs")
    if (previous.get("version") != SETUP_VERSION or not isinstance(outputs, dict) or KARPATHY not in outputs
            or (inputs is not None and previous.get("inputs") != inputs)
            or any(not (root / name).is_file() or file_sha256(root / name) != digest
                   for name, digest in outputs.items())):
        return False
    photos = _photos(root / "images")
    return all(entry["filename"] in photos for entry in read_json(root / KARPATHY)["images"])


def _prepare_root(root: str | Path) -> Path:
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise CaptionerError(f"{root}: a file, not a folder (--root)")
    root.mkdir(parents=True, exist_ok=True)
    for leftover in (".images.unpacking", ".text.unpacking"):        # what an interrupted run left
        shutil.rmtree(root / leftover, ignore_errors=True)
    return root


def _record_result(previous: dict) -> dict:
    """The counts and skips of the split ``flickr8k_setup.json`` records, for a run that found it current."""
    return {key: previous[key] for key in ("kind", "counts", "skipped", "unused")} | {"outputs": "verified"}


def setup_flickr8k(root: str | Path, source: str | Path | None = None, keep_zips: bool = False) -> dict:
    """Set Flickr8k up in ``root`` from ``source`` (``--from``) or the network (see the module docstring); returns
    what each step did, the split's counts and what it skipped (see :func:`format_summary`)."""
    root = _prepare_root(root)
    previous = read_record(root / RECORD)
    result: dict = {"root": str(root), "source": str(source) if source else RELEASE, "steps": {},
                    "downloaded_bytes": 0}
    if source is None and previous.get("kind") == "karpathy" and _outputs_current(root, previous, None):
        # made from a local split file by an earlier run: nothing to download, only to verify
        result["steps"] = {"text": f"the {KARPATHY} of {previous.get('source')}",
                           "images": "already in place (verified)"}
        return result | _record_result(previous)
    karpathy, skipped = None, Skipped()
    if source is None:
        download_archives(root, keep_zips, result)
    else:
        karpathy = from_local(root, Path(source), result)
    if karpathy is not None:
        entries, sources = karpathy_split(karpathy, skipped)
        if not entries:
            raise CaptionerError(f"{karpathy}: none of its entries has a photo where its filepath says, with a "
                                 "caption; nothing written")
        result["steps"]["images"] = place_photos(sources, root)
    photos = _photos(root / "images")
    inputs = ({"karpathy": file_sha256(karpathy)} if karpathy is not None
              else {name: file_sha256(root / "text" / name) for name in TEXT_FILES}) | {"photos": _names_digest(photos)}
    if _outputs_current(root, previous, inputs):
        return result | _record_result(previous)
    if karpathy is None:
        entries = official_split(root / "text", photos, skipped)
    if not entries:
        raise CaptionerError(f"{root / 'text'}: no listed photo is in {root / 'images'} with a caption; nothing "
                             "written")
    listed = {entry["filename"] for entry in entries}
    record = {"version": SETUP_VERSION, "kind": "official" if karpathy is None else "karpathy",
              "source": result["source"], "counts": split_counts(entries), "skipped": skipped.as_dict(),
              "unused": len(photos - listed - set(skipped.listed_without_captions)), "inputs": inputs,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    written = {KARPATHY: {"dataset": "flickr8k", "images": entries},
               **{COCO_CAPTIONS.format(split): coco_captions(entries, split) for split in SPLITS}}
    for name, content in written.items():
        write_file(root / name, json.dumps(content))
    record["outputs"] = {name: file_sha256(root / name) for name in written}
    if karpathy is not None and karpathy.resolve() == (root / KARPATHY).resolve():    # rewritten in place
        record["inputs"]["karpathy"] = record["outputs"][KARPATHY]
    write_file(root / RECORD, json.dumps(record, indent=2))
    return result | {key: record[key] for key in ("kind", "counts", "skipped", "unused")} | {"outputs": "written"}


def next_commands(root: str | Path, test: bool = True) -> list[str]:
    """The commands after the setup: train, score, caption one's own photos; with the ``data.*`` overrides a root
    other than ``data/flickr8k`` needs. ``test``: whether the split has test photos (else score on val)."""
    root = Path(root)
    overrides = ""
    if root.resolve() != CONFIG_ROOT.resolve():
        overrides = " " + " ".join(shlex.quote(o) for o in (f"data.karpathy={root / KARPATHY}",
                                                             f"data.image_root={root}"))
    checkpoint = f"runs/{FIRST_RECIPE}/best.pt"
    return [f"captioner train {FIRST_RECIPE}{overrides}",
            f"captioner evaluate --checkpoint {checkpoint} --split {'test' if test else 'val'}",
            f"captioner caption my_photos/*.jpg --checkpoint {checkpoint}"]


def _count(n: int, word: str) -> str:
    """``1 caption``, ``2 captions``, ``1,000 photos``."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _skipped_lines(skipped: dict, unused: int) -> list[str]:
    """What :func:`format_summary` says of the names and captions left out."""
    def shown(item: dict) -> str:
        more = ", ..." if item["names"] > len(item["shown"]) else ""
        return f" ({', '.join(item['shown'])}{more})" if item["shown"] else ""

    parts = []
    orphans = skipped["captions_without_photo"]
    if orphans["names"]:
        parts.append(f"{_count(orphans['captions'], 'caption')} of {_count(orphans['names'], 'name')} that "
                     f"{'is' if orphans['names'] == 1 else 'are'} no photo{shown(orphans)}")
    for key, what, last in (("listed_without_photo", "listed name", " without a photo"),
                            ("listed_without_captions", "listed photo", " without a caption"),
                            ("listed_twice", "name", " listed a second time")):
        if skipped[key]["names"]:
            parts.append(f"{_count(skipped[key]['names'], what)}{last}{shown(skipped[key])}")
    if skipped["empty_captions"]:
        parts.append(f"{_count(skipped['empty_captions'], 'caption')} without a word")
    if skipped["malformed"]:
        n = skipped["malformed"]
        parts.append(f"{n:,} {'line or entry' if n == 1 else 'lines or entries'} that cannot be read")
    lines = [f"  skipped: {'; '.join(parts)}" if parts else "  skipped: nothing"]
    if unused:
        lines.append(f"  unused: {_count(unused, 'photo')} in no split")
    return lines


def format_summary(result: dict) -> str:
    """What :func:`setup_flickr8k` did, in a few lines, then the next commands."""
    counts = result["counts"]
    official = result["kind"] == "official"
    lines = [f"Flickr8k in {result['root']}:",
             f"  photos: {result['steps']['images']}",
             f"  captions and split: {result['steps']['text']}",
             "  split: " + ", ".join(f"{s} {_count(c['images'], 'photo')} ({_count(c['captions'], 'caption')})"
                                     if c["images"] else f"{s} none" for s, c in counts.items()),
             "  split from: " + ("the official lists Flickr_8k.{train,dev,test}Images.txt (Hodosh et al. 2013; dev is "
                                 "val), captions from Flickr8k.token.txt" if official else "the given " + KARPATHY),
             *_skipped_lines(result["skipped"], result.get("unused", 0)),
             f"  {KARPATHY}, {COCO_CAPTIONS.format('{train,val,test}')}, {RECORD}: "
             + ("up to date (verified)" if result["outputs"] == "verified" else "written")]
    downloaded = result["downloaded_bytes"]
    lines.append(f"  downloaded {human_bytes(downloaded)}" if downloaded else
                 "  nothing downloaded" + ("; everything was in place and verified" if result["outputs"] == "verified"
                                           else ""))
    train, evaluate, caption = next_commands(result["root"], test=counts["test"]["images"] > 0)
    lines += ["next: train (it caches the encoder's features of every photo first), score, caption your own photos:",
              f"  {train}", f"  {evaluate}", f"  {caption}"]
    return "\n".join(lines)
