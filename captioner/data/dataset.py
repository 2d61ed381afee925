"""One dataset class for raw images or cached features, a padding collate, and a resumable sampler."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from captioner.data.config import DataConfig
from captioner.data.feature_cache import FeatureCache, mirrored_folder
from captioner.data.images import image_transform, load_image
from captioner.data.readers import ImageRecord
from captioner.data.vocabulary import Vocabulary
from captioner.errors import CaptionerError, ImageError

log = logging.getLogger(__name__)


class CaptionDataset(Dataset):
    """Items are ``(image, caption)`` pairs (``pairs=True``, training) or one item per image (evaluation).

    The visual input is either the raw image (``transform`` given) or its cached features
    (``features`` given): ``visual`` is ``(3, H, W)`` or ``(L, D)``. Every record keeps all of its
    captions, so evaluation can score against all references. Images missing from the feature cache
    (unreadable when the cache was built) are left out and counted in ``missing``.

    Item ``i + len(self)`` is item ``i`` mirrored: its image flipped left to right (from features: read from
    ``mirrored``, the cache of the flipped images) and the words ``left`` and ``right`` of its caption swapped.
    """

    def __init__(self, records: Sequence[ImageRecord], vocab: Vocabulary, max_caption_length: int, *,
                 features: FeatureCache | None = None, transform=None, pairs: bool = True,
                 max_pixels: int = 64_000_000, strict: bool = False, mirrored: FeatureCache | None = None):
        if (features is None) == (transform is None):
            raise ValueError("give exactly one of features or transform")
        if mirrored is not None and features is None:
            raise ValueError("a mirror cache goes with features")
        self.vocab, self.max_caption_length = vocab, max_caption_length
        self.features, self.transform, self.mirrored = features, transform, mirrored
        self.max_pixels, self.strict = max_pixels, strict
        caches = [cache for cache in (features, mirrored) if cache is not None]
        self.missing = [r.image_id for r in records if not all(r.image_id in cache for cache in caches)]
        if self.missing and strict:
            raise CaptionerError(f"{features.folder}: {len(self.missing)} image(s) missing from the feature cache, "
                                 f"e.g. id {self.missing[0]} (data.strict is on)")
        missing = set(self.missing)
        self.records = [r for r in records if r.image_id not in missing]
        # Flat NumPy arrays rather than a Python object per item or caption: a fraction of the memory, and
        # DataLoader workers read them without writing reference counts into every page they share with the
        # main process (which copies the page into each worker's own memory).
        self.image_ids = np.array([r.image_id for r in self.records], dtype=np.int64)
        encoded = [vocab.encode(c, max_caption_length) for r in self.records for c in r.captions]
        self.tokens = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32, count=sum(map(len, encoded)))
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)    # caption k: tokens[offsets[k]:offsets[k + 1]]
        np.cumsum([len(e) for e in encoded], out=self.offsets[1:])
        counts = [len(r.captions) for r in self.records]
        self.record_captions = np.zeros(len(self.records) + 1, dtype=np.int64)   # record r: captions in [r, r + 1)
        np.cumsum(counts, out=self.record_captions[1:])
        # item i: record item_record[i] with its caption item_caption[i] (an index into offsets; -1: no caption)
        self.item_record = np.repeat(np.arange(len(self.records)), counts) if pairs else np.arange(len(self.records))
        self.item_caption = np.arange(len(encoded)) if pairs else np.full(len(self.records), -1)
        self.mirror_words = torch.arange(len(vocab))     # word index -> its index in a mirrored caption
        if "left" in vocab.index and "right" in vocab.index:
            self.mirror_words[[vocab.index["left"], vocab.index["right"]]] = torch.tensor(
                [vocab.index["right"], vocab.index["left"]])

    def __len__(self) -> int:
        return len(self.item_record)

    def caption_length(self, index: int) -> int:
        caption = self.item_caption[index]
        return int(self.offsets[caption + 1] - self.offsets[caption]) if caption >= 0 else 0

    def random_captions(self, records: torch.Tensor) -> torch.Tensor:
        """One caption of each record (``records`` (B,) record indices, as batches carry in ``index``), drawn
        uniformly by torch's global generator, padded: (B, T), ``<start> .. <end> <pad>..``."""
        first = torch.from_numpy(self.record_captions[records.numpy()])
        counts = torch.from_numpy(self.record_captions[records.numpy() + 1]) - first
        picks = first + (torch.rand(len(records)) * counts).long().clamp(max=counts - 1)
        return pad_captions([torch.from_numpy(self.tokens[self.offsets[k]:self.offsets[k + 1]]).long()
                             for k in picks.tolist()])

    @property
    def visual_kind(self) -> str:
        """What ``visual`` holds: ``"features"`` (from the cache) or ``"images"``."""
        return "features" if self.features is not None else "images"

    def __getitem__(self, index: int) -> dict:
        mirror, index = divmod(index, len(self))
        if mirror > 1 or (mirror and self.features is not None and self.mirrored is None):
            raise IndexError(f"item {index + mirror * len(self)} of a dataset of {len(self)} items"
                             f"{' (no mirror cache)' if mirror == 1 else ''}")
        record_index, caption = int(self.item_record[index]), int(self.item_caption[index])
        image_id = int(self.image_ids[record_index])
        item = {"index": record_index, "image_id": image_id, "caption": None, "visual": None, "error": None,
                "kind": self.visual_kind}
        if caption >= 0:
            item["caption"] = torch.from_numpy(self.tokens[self.offsets[caption] : self.offsets[caption + 1]]).long()
            if mirror:
                item["caption"] = self.mirror_words[item["caption"]]
        if self.features is not None:
            item["visual"] = (self.mirrored if mirror else self.features)[image_id]
        else:
            try:
                path = self.records[record_index].path
                item["visual"] = self.transform(load_image(path, max_pixels=self.max_pixels))
                if mirror:
                    item["visual"] = item["visual"].flip(-1)
            except ImageError as err:
                if self.strict:
                    raise
                item["error"] = str(err)
        return item


def collate(items: list[dict]) -> dict:
    """Stack visuals and pad captions with ``<pad>`` (index 0).

    Returns ``images`` (B, 3, H, W) or ``features`` (B, L, D) (whichever the dataset holds; absent when every
    image of the batch was unreadable), ``captions`` (B, T) long (``<start> .. <end> <pad>..``), ``lengths``
    (B,) tokens including ``<start>``/``<end>``, ``index`` (B,) record indices, ``image_id``, ``size`` B, and
    ``errors`` (messages of unreadable images that were dropped from the batch).
    """
    errors = [it["error"] for it in items if it["error"] is not None]
    items = [it for it in items if it["error"] is None]
    batch = {"errors": errors, "index": torch.tensor([it["index"] for it in items], dtype=torch.long),
             "image_id": [it["image_id"] for it in items], "size": len(items)}
    if items:
        batch[items[0]["kind"]] = torch.stack([it["visual"] for it in items])
    if items and items[0]["caption"] is not None:
        batch["captions"] = pad_captions([it["caption"] for it in items])
        batch["lengths"] = torch.tensor([len(it["caption"]) for it in items], dtype=torch.long)
    return batch


def pad_captions(captions: list[torch.Tensor]) -> torch.Tensor:
    """Token sequences of different lengths as one (B, T) long tensor padded with ``<pad>`` (index 0)."""
    out = torch.zeros(len(captions), max(len(c) for c in captions), dtype=torch.long)
    for row, caption in enumerate(captions):
        out[row, :len(caption)] = caption
    return out


def visual_inputs(batch: dict, device: torch.device, channels_last: bool = False) -> dict[str, torch.Tensor]:
    """``{"images": ...}`` or ``{"features": ...}`` of a collated batch on ``device``, the keyword arguments
    of :meth:`~captioner.models.captioner.Captioner.regions` and of the model's forward pass."""
    kind = "images" if "images" in batch else "features"
    visual = batch[kind].to(device, non_blocking=True)
    if channels_last and kind == "images":
        visual = visual.contiguous(memory_format=torch.channels_last)
    return {kind: visual}


def make_dataset(data: DataConfig, records: Sequence[ImageRecord], vocab: Vocabulary, encoder, *, pairs: bool,
                 whole_cache_only: bool = False, mirrored: bool = False) -> CaptionDataset:
    """The dataset of ``records`` as the config's ``data`` section says: cached features when ``data.features``
    names a cache (images it lacks are left out and counted in ``missing``), else images through the
    encoder's transform. With ``whole_cache_only`` (evaluation) the cache is used only when it holds every
    record, and the raw images otherwise. ``mirrored``: with the mirror cache too (:func:`mirrored_folder`), so
    that the mirrored items can be read."""
    common = {"max_caption_length": data.max_caption_length, "max_pixels": data.max_pixels,
              "strict": data.strict, "pairs": pairs}
    if data.features and (not whole_cache_only or Path(data.features).exists()):
        cache = FeatureCache(data.features)
        if not whole_cache_only or all(r.image_id in cache for r in records):
            mirror_cache = mirror_cache_of(cache) if mirrored else None
            dataset = CaptionDataset(records, vocab, features=cache, mirrored=mirror_cache, **common)
            if dataset.missing:
                log.warning("%s: %d image(s) missing from the feature cache are skipped", cache.folder,
                            len(dataset.missing))
            return dataset
    return CaptionDataset(records, vocab, transform=image_transform(encoder), **common)


def mirror_cache_of(cache: FeatureCache) -> FeatureCache:
    """The mirror cache of ``cache`` (:func:`mirrored_folder`); one line naming it when it is missing or is not a
    cache of mirrored images by the same encoder."""
    folder = mirrored_folder(cache.folder)
    if not (folder / "meta.json").exists():
        raise CaptionerError(f"{folder}: no mirror cache for data.mirror; run 'captioner cache-features CONFIG "
                             "--splits train --mirrored'")
    mirrored = FeatureCache(folder)
    if not mirrored.meta.get("mirrored"):
        raise CaptionerError(f"{folder / 'meta.json'}: a cache of images as they are, not mirrored")
    if mirrored.meta.get("encoder") != cache.meta.get("encoder") or mirrored.grid != cache.grid:
        raise CaptionerError(f"{folder}: cached with another encoder than {cache.folder}; re-cache it")
    return mirrored


class EpochSampler(Sampler[int]):
    """A fresh permutation per epoch from ``(seed, epoch)``, split across ranks, resumable mid-epoch.

    The order depends only on the seed and epoch, so a run resumed at ``(epoch, start)`` sees the items an
    uninterrupted run would. Rank ``r`` takes every ``world_size``-th item from ``r`` (the permutation padded to
    a multiple of ``world_size``). With ``lengths`` (per item) and ``bucket_batch`` (the global batch size), each
    window of :attr:`BUCKET_WINDOW` global batches is sorted by length and its batches shuffled (less padding).
    With ``mirror`` > 0, each item of that order is drawn mirrored (index ``i + num_items``, as
    :class:`CaptionDataset` reads it) with that chance, from the same generator: the order stays as it is.
    """

    BUCKET_WINDOW = 50

    def __init__(self, num_items: int, seed: int, rank: int = 0, world_size: int = 1,
                 lengths: Sequence[int] | None = None, bucket_batch: int = 0, mirror: float = 0.0):
        self.num_items, self.seed = num_items, seed
        self.rank, self.world_size = rank, world_size
        self.lengths, self.bucket_batch, self.mirror = lengths, bucket_batch, mirror
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Iterate epoch ``epoch`` from its ``start``-th item of this rank on."""
        self.epoch, self.start = epoch, start

    def _rank_indices(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.num_items, generator=generator).tolist()
        if self.lengths is not None and self.bucket_batch > 0:
            order = self._bucketed(order, generator)
        if self.mirror > 0:
            flips = (torch.rand(len(order), generator=generator) < self.mirror).tolist()
            order = [i + self.num_items if flip else i for i, flip in zip(order, flips)]
        per_rank = -(-self.num_items // self.world_size)
        order += order[: per_rank * self.world_size - len(order)]
        return order[self.rank :: self.world_size]

    def _bucketed(self, order: list[int], generator: torch.Generator) -> list[int]:
        window = self.bucket_batch * self.BUCKET_WINDOW
        out = []
        for begin in range(0, len(order), window):
            chunk = sorted(order[begin : begin + window], key=lambda i: self.lengths[i])
            batches = [chunk[k : k + self.bucket_batch] for k in range(0, len(chunk), self.bucket_batch)]
            full = [b for b in batches if len(b) == self.bucket_batch]   # a short last batch stays last
            for b in torch.randperm(len(full), generator=generator).tolist():
                out.extend(full[b])
            out.extend(i for b in batches[len(full):] for i in b)
        return out

    def __iter__(self):
        return iter(self._rank_indices()[self.start :])

    def __len__(self) -> int:
        return -(-self.num_items // self.world_size) - self.start
