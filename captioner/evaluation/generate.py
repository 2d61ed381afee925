"""Decode a whole split with a trained model, then score it."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioner.data.dataset import CaptionDataset, collate, visual_inputs
from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import DecodeConfig, Generation, decode


def generate_captions(model, dataset: CaptionDataset, vocab: Vocabulary, settings: DecodeConfig, *, batch_size: int = 64,
                      max_images: int | None = None, progress: bool = False,
                      shard: tuple[int, int] = (0, 1)) -> dict[int, Generation]:
    """``{image_id: Generation}`` for the images of ``dataset`` (built with ``pairs=False``); with
    ``shard = (rank, world_size)`` only every ``world_size``-th of them, from the ``rank``-th on."""
    indices = range(len(dataset)) if max_images is None else range(min(max_images, len(dataset)))
    rank, world_size = shard
    loader = DataLoader(torch.utils.data.Subset(dataset, list(indices)[rank::world_size]), batch_size=batch_size,
                        collate_fn=collate)
    device = model.device
    model.eval()
    out: dict[int, Generation] = {}
    with torch.inference_mode():
        for batch in tqdm(loader, desc="decoding", unit="batch", disable=not progress, leave=False):
            if batch["size"] == 0:
                continue
            generations = decode(model.decoder, model.regions(**visual_inputs(batch, device)), vocab, settings,
                                 images=batch["image_id"])
            out.update(zip(batch["image_id"], generations))
    return out


def caption_texts(generations: Mapping[int, Generation], vocab: Vocabulary) -> dict[int, str]:
    return {image_id: vocab.decode(g.tokens) for image_id, g in generations.items()}
