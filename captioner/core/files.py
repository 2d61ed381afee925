"""Files written atomically with the permissions ``open`` would give them, file digests, JSON read with one-line
errors naming the file."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from captioner.errors import CaptionerError


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()
"""The process's umask, read once at import: the permissions a file or folder made by ``open`` or ``mkdir`` gets
are ``0o666 & ~UMASK`` and ``0o777 & ~UMASK``; files written through a temporary file get the same."""


def atomic_write(path: str | Path, write) -> None:
    """Write ``path`` through ``write(file_object)`` into a temporary file, fsync it, then rename it over
    ``path``: a crash or a full disk never leaves a half-written file behind, and the old file stays. The file gets
    the permissions ``open`` would give it (the temporary file's own are owner-only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    if hasattr(os, "fchmod"):
        os.fchmod(fd, 0o666 & ~UMASK)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_file(path: str | Path, content: str | bytes | Callable[[BinaryIO], object]) -> Path:
    """Write an output file atomically (:func:`atomic_write`): ``content`` as UTF-8 text, bytes, or written by
    ``content(binary_file)``. A failed write (a full disk, a folder that cannot be written) is a
    :class:`~captioner.errors.CaptionerError` naming the file; the file as it was stays."""
    path = Path(path)
    if isinstance(content, str):
        content = content.encode("utf-8")
    write = (lambda handle: handle.write(content)) if isinstance(content, bytes) else content
    try:
        atomic_write(path, write)
    except (FileExistsError, NotADirectoryError):
        folder = next(parent for parent in path.parents if parent.exists())
        raise CaptionerError(f"{path}: cannot write: {folder} is a file, not a folder") from None
    except OSError as err:
        raise CaptionerError(f"{path}: cannot write ({err.strerror or err}); the file as it was is unchanged") from None
    return path


def file_digest(path: str | Path, digest) -> str:
    """A file's bytes, read a block at a time, through the ``hashlib`` object ``digest``; its hex digits."""
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, as hex digits."""
    return file_digest(path, hashlib.sha256())


def read_json(path: str | Path, object_hook: Callable[[dict], object] | None = None) -> object:
    """Parse a JSON file (each object through ``object_hook`` as it is decoded, when given); errors name the file
    and the line/column at fault."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            return json.load(handle, object_hook=object_hook)
    except FileNotFoundError:
        raise CaptionerError(f"{path}: file not found") from None
    except json.JSONDecodeError as err:
        raise CaptionerError(f"{path}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    except UnicodeDecodeError as err:
        raise CaptionerError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise CaptionerError(f"{path}: cannot read ({err.strerror})") from None


def read_record(path: str | Path) -> dict:
    """The JSON object an earlier run left in ``path`` (a set-up's record), ``{}`` when it is missing, unreadable or
    not an object: such a record is redone, never an error."""
    try:
        record = read_json(path)
    except CaptionerError:
        return {}
    return record if isinstance(record, dict) else {}
