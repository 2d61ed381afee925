"""Decode a whole split with a trained model, then score it."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioner.data.dataset import CaptionDataset, collate
from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import Generation, decode


def generate_captions(model, dataset: CaptionDataset, vocab: Vocabulary, *, beam_size: int, max_length: int,
                      length_penalty: float = 0.0, batch_size: int = 64, max_images: int | None = None,
                      progress: bool = False, shard: tuple[int, int] = (0, 1)) -> dict[int, Generation]:
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
            if batch["visual"] is None:
                continue
            features = model.features(batch["visual"].to(device))
            generations = decode(model.decoder, features, beam_size=beam_size, max_length=max_length,
                                 start_index=vocab.start_index, end_index=vocab.end_index,
                                 length_penalty=length_penalty)
            out.update(zip(batch["image_id"], generations))
    return out


def caption_texts(generations: Mapping[int, Generation], vocab: Vocabulary) -> dict[int, str]:
    return {image_id: vocab.decode(g.tokens) for image_id, g in generations.items()}
