"""Cached encoder features: a memory-mapped ``(N, L, D)`` array with an index by image id.

Layout of a cache folder::

    features.npy   (N, L, D) float16 (or float32), written in place through a memory map
    status.npy     (N,) uint8: 0 = not yet written, 1 = written, 2 = image unreadable
    meta.json      image ids (row order), grid, feature size, dtype, the encoder config, the splits cached,
                   whether the images were mirrored (flipped left to right) before the encoder
    failed.json    {image_id: reason} for unreadable images

Writing is resumable: rows already marked written are skipped when the same images and encoder are
cached again into the same folder. The disk space of the whole array is reserved when the cache is created
(a full disk is one line then, not a crash of the memory map half-way). Reading never loads the whole
array: each lookup touches one row.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from captioner.core.console import progress_bar
from captioner.core.files import read_json, write_file
from captioner.data.images import load_image
from captioner.data.readers import ImageRecord
from captioner.errors import CaptionerError, ImageError

PENDING, WRITTEN, FAILED = 0, 1, 2


class RecordImages(Dataset):
    """Loads each record's image as a tensor; unreadable images come back as ``(index, None, reason)``."""

    def __init__(self, records: Sequence[ImageRecord], transform, max_pixels: int):
        self.records, self.transform, self.max_pixels = records, transform, max_pixels

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        try:
            image = load_image(self.records[index].path, max_pixels=self.max_pixels)
        except ImageError as err:
            return index, None, str(err)
        return index, self.transform(image), None


def _collate_images(batch):
    good = [(i, x) for i, x, _ in batch if x is not None]
    failed = [(i, reason) for i, x, reason in batch if x is None]
    indices = [i for i, _ in good]
    images = torch.stack([x for _, x in good]) if good else None
    return indices, images, failed


def build_feature_cache(encoder, records: Sequence[ImageRecord], out_dir: str | Path, *, transform,
                        batch_size: int = 32, num_workers: int = 0, max_pixels: int = 64_000_000,
                        dtype: str = "float16", encoder_config: dict | None = None,
                        splits: Sequence[str] = (), mirrored: bool = False, progress: bool = True) -> dict:
    """Run the frozen ``encoder`` once over every record's image and store the features (``mirrored``: the
    ``transform`` flips each image left to right, which the cache's meta.json records).

    Returns ``{"written": n, "failed": {image_id: reason}, "skipped": n_already_done}``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    unique = {}
    for record in records:
        unique.setdefault(record.image_id, record)
    ids = sorted(unique)
    ordered = [unique[i] for i in ids]
    meta = {"image_ids": ids, "grid": list(encoder.grid), "feature_dim": encoder.feature_dim,
            "dtype": dtype, "encoder": encoder_config or {}, "splits": list(splits)}
    if mirrored:
        meta["mirrored"] = True
    shape = (len(ids), encoder.grid[0] * encoder.grid[1], encoder.feature_dim)
    features, status, failed = _open_cache(out_dir, meta, shape)
    failed_path = out_dir / "failed.json"
    todo = [i for i in range(len(ids)) if status[i] == PENDING]
    skipped = len(ids) - len(todo)
    loader = DataLoader(RecordImages([ordered[i] for i in todo], transform, max_pixels), batch_size=batch_size,
                        num_workers=num_workers, collate_fn=_collate_images)
    device = next(encoder.parameters()).device
    encoder.eval()
    written = 0
    bar = progress_bar(total=len(ids), initial=skipped, desc="caching features", unit="img", show=progress)
    with torch.inference_mode():
        for indices, images, bad in loader:
            rows = [todo[i] for i in indices]
            if images is not None:
                out = encoder(images.to(device)).float().cpu().numpy()
                features[rows] = out.astype(features.dtype)
                written += len(rows)
            for i, reason in bad:
                failed[str(ids[todo[i]])] = reason
                status[todo[i]] = FAILED
            features.flush()
            status[rows] = WRITTEN  # marked only after the rows are on disk
            status.flush()
            if bad:
                write_file(failed_path, json.dumps(failed, indent=1))
            bar.update(len(indices) + len(bad))
            bar.set_postfix(failed=len(failed))
    bar.close()
    return {"written": written, "failed": failed, "skipped": skipped}


def _open_cache(out_dir: Path, meta: dict, shape: tuple[int, int, int]):
    """The cache's memory maps ``(features, status)`` and its ``{image_id: reason}`` of unreadable images: those
    already in ``out_dir`` when it holds a cache of the same images and encoder (resuming), else new ones. The
    features file's disk space is reserved either way."""
    meta_path, features_path, status_path = out_dir / "meta.json", out_dir / "features.npy", out_dir / "status.npy"
    if meta_path.exists() and features_path.exists() and status_path.exists():
        if _without_splits(read_meta(out_dir)) != _without_splits(meta):
            raise CaptionerError(f"{out_dir}: holds a cache of other images or another encoder; "
                                 "choose an empty folder or delete it")
        check_arrays(out_dir, meta)
        reserve_space(features_path)
        failed_path = out_dir / "failed.json"
        failed = read_json(failed_path) if failed_path.exists() else {}
        return np.load(features_path, mmap_mode="r+"), np.load(status_path, mmap_mode="r+"), failed
    features = np.lib.format.open_memmap(features_path, mode="w+", dtype=np.dtype(meta["dtype"]), shape=shape)
    try:
        reserve_space(features_path)
    except CaptionerError:
        del features
        features_path.unlink()
        raise
    status = np.lib.format.open_memmap(status_path, mode="w+", dtype=np.uint8, shape=(shape[0],))
    write_file(meta_path, json.dumps(meta))
    return features, status, {}


def _without_splits(meta: dict) -> dict:
    """A cache's identity: its images and encoder (caches made before meta.json named the splits match too)."""
    return {k: v for k, v in meta.items() if k != "splits"}


def reserve_space(path: Path) -> None:
    """Allocate the disk blocks of ``path`` (a sparse file of its final size) now, so that a full disk is one line
    naming the file and the space needed, instead of SIGBUS when the memory map first writes to a missing block.
    Where the file system cannot allocate ahead (``posix_fallocate`` unsupported), its free space is checked."""
    size = path.stat().st_size
    allocated = path.stat().st_blocks * 512
    needed = max(size - allocated, 0)
    free = shutil.disk_usage(path.parent).free
    if needed > free:
        raise _no_space(path, size, needed, free)
    if not hasattr(os, "posix_fallocate"):
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise _no_space(path, size, needed, shutil.disk_usage(path.parent).free) from None
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise CaptionerError(f"{path}: cannot reserve {size / 1e9:.2f} GB ({err.strerror})") from None
    finally:
        os.close(fd)


def _no_space(path: Path, size: int, needed: int, free: int) -> CaptionerError:
    return CaptionerError(f"{path}: the feature cache needs {size / 1e9:.2f} GB ({needed / 1e9:.2f} GB not yet on "
                          f"disk) and {path.parent} has {free / 1e9:.2f} GB free; free some space or choose another "
                          "folder (data.features or --out)")


def mirrored_folder(features: str | Path) -> Path:
    """The cache of the mirror images (each flipped left to right) that goes with the feature cache ``features``:
    what ``data.mirror`` reads."""
    return Path(features) / "mirrored"


def cache_is_complete(folder: str | Path) -> bool:
    """Whether ``folder`` holds a feature cache with every row written or marked unreadable (a damaged cache is
    an error naming the file)."""
    folder = Path(folder)
    if not (folder / "meta.json").exists():
        return False
    check_arrays(folder, read_meta(folder))
    return not bool((np.load(folder / "status.npy", mmap_mode="r") == PENDING).any())


META_KEYS = ("image_ids", "grid", "feature_dim", "dtype")


def read_meta(folder: Path) -> dict:
    """A cache folder's ``meta.json``; one line naming it when it is missing, damaged or not a cache's."""
    meta_path = folder / "meta.json"
    if not meta_path.exists():
        raise CaptionerError(f"{folder}: not a feature cache (no meta.json); run 'captioner cache-features'")
    meta = read_json(meta_path)
    if not isinstance(meta, dict) or not all(key in meta for key in META_KEYS):
        raise CaptionerError(f"{meta_path}: not a feature cache's meta.json (needs {', '.join(META_KEYS)})")
    return meta


def check_arrays(folder: Path, meta: dict) -> None:
    """Check that ``features.npy`` and ``status.npy`` are whole arrays of the shapes ``meta`` gives: a file cut
    short (an interrupted copy, a full disk) would otherwise read, or be extended, as rows of zeros."""
    rows = len(meta["image_ids"])
    expected = {"features.npy": ((rows, meta["grid"][0] * meta["grid"][1], meta["feature_dim"]), np.dtype(meta["dtype"])),
                "status.npy": ((rows,), np.dtype(np.uint8))}
    for name, (shape, dtype) in expected.items():
        path = folder / name
        try:
            with path.open("rb") as handle:
                version = np.lib.format.read_magic(handle)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                found_shape, _, found_dtype = read_header(handle)
                data_start = handle.tell()
        except FileNotFoundError:
            raise CaptionerError(f"{path}: missing from the feature cache; run 'captioner cache-features'") from None
        except (ValueError, OSError, EOFError) as err:
            raise CaptionerError(f"{path}: not a readable NumPy array ({err})") from None
        if tuple(found_shape) != shape or found_dtype != dtype:
            raise CaptionerError(f"{path}: holds {found_dtype} {tuple(found_shape)}, not the {dtype} {shape} that "
                                 f"{folder / 'meta.json'} describes")
        size, needed = path.stat().st_size, data_start + int(np.prod(shape)) * dtype.itemsize
        if size < needed:
            raise CaptionerError(f"{path}: truncated ({size} of {needed} bytes); delete {folder} and run "
                                 "'captioner cache-features' again")


class FeatureCache:
    """Read-only view of a cache folder: ``cache[image_id]`` -> features ``(L, D)`` as a float32 tensor."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.meta = read_meta(self.folder)
        check_arrays(self.folder, self.meta)
        self.row_of = {int(i): row for row, i in enumerate(self.meta["image_ids"])}
        self.grid = tuple(self.meta["grid"])
        self.feature_dim = int(self.meta["feature_dim"])
        self._features = None
        self._status = np.load(self.folder / "status.npy")

    @property
    def features(self) -> np.ndarray:
        # Opened lazily so that each DataLoader worker maps the file itself.
        if self._features is None:
            self._features = np.load(self.folder / "features.npy", mmap_mode="r")
        return self._features

    def __contains__(self, image_id: int) -> bool:
        row = self.row_of.get(int(image_id))
        return row is not None and self._status[row] == WRITTEN

    def __getitem__(self, image_id: int) -> torch.Tensor:
        row = self.row_of.get(int(image_id))
        if row is None or self._status[row] != WRITTEN:
            raise KeyError(f"image id {image_id} is not in the feature cache {self.folder}")
        # copied as stored, then widened by torch: NumPy's float16 -> float32 conversion is several times slower
        return torch.from_numpy(np.array(self.features[row])).float()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_features"] = None  # never pickle a memory map into worker processes
        return state


def check_cache_matches(folder: str | None, encoder_config) -> None:
    """Refuse a cache made by another encoder than ``encoder_config`` (an
    :class:`~captioner.models.encoder.EncoderConfig`): training from it would silently learn from the wrong
    features."""
    if not folder:
        return
    cached = FeatureCache(folder).meta.get("encoder") or {}
    mismatched = [k for k in ("name", "image_size", "stride", "grid") if k in cached and cached[k] != getattr(encoder_config, k)]
    if mismatched:
        raise CaptionerError(f"{folder}: cached with another encoder "
                             f"({', '.join(f'{k}={cached[k]!r}' for k in mismatched)}); match the encoder section or re-cache")
