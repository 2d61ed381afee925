"""Decode a whole split with a trained model, then score it."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
from torch.utils.data import DataLoader

from captioner.core.console import progress_bar
from captioner.data.dataset import CaptionDataset, collate, visual_inputs
from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import DecodeConfig, Generation, decode

log = logging.getLogger(__name__)


def generate_captions(model, dataset: CaptionDataset, vocab: Vocabulary, decode_config: DecodeConfig, *,
                      batch_size: int = 64,
                      max_images: int | None = None, progress: bool = False,
                      shard: tuple[int, int] = (0, 1)) -> dict[int, Generation]:
    """``{image_id: Generation}`` for the images of ``dataset`` (built with ``pairs=False``); with
    ``shard = (rank, world_size)`` only every ``world_size``-th of them, from the ``rank``-th on. An unreadable
    image is left out with a warning naming it."""
    indices = range(len(dataset)) if max_images is None else range(min(max_images, len(dataset)))
    rank, world_size = shard
    loader = DataLoader(torch.utils.data.Subset(dataset, list(indices)[rank::world_size]), batch_size=batch_size,
                        collate_fn=collate)
    device = model.device
    model.eval()
    out: dict[int, Generation] = {}
    with torch.inference_mode():
        for batch in progress_bar(loader, desc="decoding", unit="batch", show=progress, leave=False):
            warn_unreadable(batch, set())
            if batch["size"] == 0:
                continue
            generations = decode(model.decoder, model.regions(**visual_inputs(batch, device)), vocab, decode_config,
                                 images=batch["image_id"])
            out.update(zip(batch["image_id"], generations))
    return out


def warn_unreadable(batch: dict, warned: set[str]) -> None:
    """A warning for each unreadable image of ``batch`` not in ``warned`` yet (an image comes once per caption
    in a dataset of pairs), which it joins."""
    for message in batch["errors"]:
        if message not in warned:
            warned.add(message)
            log.warning("skipped unreadable image: %s", message)


def read_references(model, dataset: CaptionDataset, *, batch_size: int = 64) -> list[tuple[int, Generation]]:
    """``(image_id, Generation)`` for every reference caption of ``dataset`` (built with ``pairs=True``): the
    attention the model pays while it reads the human caption (teacher forcing), one map per word; what
    ``captioner ground --references`` measures, free of the model's own captions' mistakes."""
    loader = DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
    device = model.device
    model.eval()
    out, warned = [], set()
    with torch.inference_mode():
        for batch in loader:
            warn_unreadable(batch, warned)
            if batch["size"] == 0:
                continue
            captions = batch["captions"].to(device)
            alpha = model(captions, **visual_inputs(batch, device)).alpha                # (B, T, L)
            for row, image_id in enumerate(batch["image_id"]):
                words = [t for t in captions[row, 1:].tolist() if t not in (0, 2)]          # no <pad>, <end>
                out.append((image_id, Generation(words, 0.0, {"alpha": alpha[row, :len(words)].float().cpu()})))
    return out


def caption_texts(generations: Mapping[int, Generation], vocab: Vocabulary) -> dict[int, str]:
    return {image_id: vocab.decode(g.tokens) for image_id, g in generations.items()}
