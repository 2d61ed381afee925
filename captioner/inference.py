"""Caption image files with a trained model: the work behind ``captioner caption`` and ``captioner attend``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from captioner.data.dataset import image_transform
from captioner.data.images import load_image
from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import Generation, decode
from captioner.errors import ImageError


@dataclass
class CaptionResult:
    """The caption of one image file, or the reason it could not be read."""

    path: Path
    caption: str | None = None
    words: list[str] | None = None
    generation: Generation | None = None
    error: str | None = None


def caption_files(model, vocab: Vocabulary, paths: Sequence[str | Path], *, beam_size: int = 3, max_length: int = 20,
                  length_penalty: float = 0.0, batch_size: int = 16, max_pixels: int = 64_000_000) -> list[CaptionResult]:
    """Caption every readable file (in batches); unreadable ones get ``error`` and the rest go on."""
    transform = image_transform(model.encoder)
    results = [CaptionResult(Path(p)) for p in paths]
    readable: list[tuple[CaptionResult, torch.Tensor]] = []
    for result in results:
        try:
            readable.append((result, transform(load_image(result.path, max_pixels=max_pixels))))
        except ImageError as err:
            result.error = str(err)
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(readable), batch_size):
            chunk = readable[start : start + batch_size]
            images = torch.stack([x for _, x in chunk]).to(model.device)
            generations = decode(model.decoder, model.features(images), beam_size=beam_size, max_length=max_length,
                                 start_index=vocab.start_index, end_index=vocab.end_index, length_penalty=length_penalty)
            for (result, _), generation in zip(chunk, generations):
                result.generation = generation
                result.words = [vocab.words[i] for i in generation.tokens]
                result.caption = " ".join(result.words)
    return results


def attention_maps(generation: Generation, grid: tuple[int, int], name: str = "alpha") -> torch.Tensor | None:
    """The per-word maps ``name`` of a generation as ``(T, gh, gw)`` (None when the decoder has none)."""
    maps = generation.attention.get(name)
    return None if maps is None else maps.reshape(-1, *grid)
