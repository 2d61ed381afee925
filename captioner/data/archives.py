"""Zip archives fetched and read safely, shared by the dataset set-ups (``captioner data coco``, ``captioner data
flickr8k``).

:func:`fetch_zip` downloads a zip resumably (:func:`captioner.data.download.download`), checks its MD5 when one is
published, and hands it to an ``unpack`` function; a zip found damaged (a wrong MD5, a bad CRC, a truncated member)
is deleted and downloaded once more, then is one line naming it. :func:`zip_files` lists a zip's files without the
macOS resource forks and refuses a member whose name would land outside the folder it is unpacked into;
:func:`extract_member` writes one member, its CRC checked on the way.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from captioner.core.files import file_digest
from captioner.data.download import download, part_path
from captioner.errors import CaptionerError

log = logging.getLogger(__name__)


def human_bytes(n: float) -> str:
    """Bytes for people: ``13.5 GB``, ``0.25 GB``, ``12 MB``, ``3 kB``."""
    if abs(n) >= 1e9:
        return f"{n / 1e9:.1f} GB"
    if abs(n) >= 1e8:
        return f"{n / 1e9:.2f} GB"
    if abs(n) >= 1e6:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e3:.0f} kB" if abs(n) >= 1e3 else f"{n:.0f} bytes"


class Damaged(Exception):
    """A zip that cannot be read through, or is not the published file: not a zip, a bad CRC, a truncated member,
    a wrong MD5. The message says which."""


def file_md5(path: str | Path) -> str:
    """The MD5 of a file's bytes, as hex digits (what dataset mirrors publish)."""
    return file_digest(path, hashlib.md5(usedforsecurity=False))


def check_md5(path: Path, md5: str) -> None:
    """Raise :class:`Damaged` when ``path``'s MD5 is not ``md5``."""
    found = file_md5(path)
    if found != md5:
        raise Damaged(f"its MD5 is {found}, the published one {md5}")


def open_zip(path: Path) -> zipfile.ZipFile:
    """``path`` opened as a zip; :class:`Damaged` when it is not one."""
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise Damaged(f"not a readable zip: {err}") from None


def unsafe_name(name: str) -> bool:
    """Whether a member name is absolute or climbs out of the folder it is unpacked into (``..``)."""
    parts = name.replace("\\", "/").split("/")
    return name.startswith(("/", "\\")) or ".." in parts or (len(parts[0]) == 2 and parts[0][1] == ":")


def zip_files(handle: zipfile.ZipFile, zip_path: Path) -> list[zipfile.ZipInfo]:
    """The files of an open zip, folders and macOS metadata (``__MACOSX/``, ``._NAME``) left out. A member whose
    name is absolute or holds ``..`` is one line naming the zip and the member."""
    files = []
    for info in handle.infolist():
        if unsafe_name(info.filename):
            raise CaptionerError(f"{zip_path}: member {info.filename!r} would be written outside the folder it is "
                                 "unpacked into; not unpacked (delete the zip)")
        path = PurePosixPath(info.filename.replace("\\", "/"))
        if info.is_dir() or "__MACOSX" in path.parts or path.name.startswith("._"):
            continue
        files.append(info)
    return files


def extract_member(handle: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    """Member ``info`` written to ``target`` (reading it to its end checks its CRC); :class:`Damaged` when the
    member cannot be read through."""
    try:
        with handle.open(info) as source, target.open("wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as err:
        target.unlink(missing_ok=True)
        raise Damaged(str(err)) from None


def fetch_zip(url: str, zip_path: Path, unpack: Callable[[Path], None], md5: str | None = None) -> int:
    """Download ``url`` to ``zip_path`` (resumably; a whole file already there is taken as it is), check it against
    ``md5`` when given, then ``unpack(zip_path)``. A zip found :class:`Damaged` (by the MD5 or by ``unpack``) is
    deleted and downloaded once more, then is a :class:`~captioner.errors.CaptionerError`. Returns the bytes
    downloaded; the zip stays (the caller deletes it)."""
    downloaded, fresh = 0, False
    while True:
        had = zip_path.stat().st_size if zip_path.exists() else (part_path(zip_path).stat().st_size
                                                                    if part_path(zip_path).exists() else 0)
        if not zip_path.exists():
            log.info("downloading %s into %s", url, zip_path.parent)
        download(url, zip_path)
        downloaded += max(zip_path.stat().st_size - had, 0)
        try:
            if md5:
                check_md5(zip_path, md5)
            unpack(zip_path)
            return downloaded
        except Damaged as err:
            zip_path.unlink(missing_ok=True)
            if fresh:
                raise CaptionerError(f"{zip_path}: damaged zip ({err}) again after a fresh download from {url}; "
                                     "deleted: run the command again later (a network, disk or server fault)") from None
            log.warning("%s: damaged zip (%s): deleted, downloading it again", zip_path, err)
            fresh = True
