"""Caption image files with a trained model and draw where it looked: the work behind ``captioner caption``
and ``captioner attend``, also used by the demo and the comparison report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image

from captioner.data.images import image_transform, load_image
from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import DecodeConfig, Generation, decode
from captioner.errors import CaptionerError, ImageError
from captioner.evaluation.grounding import boxes_of_named_objects


@dataclass
class CaptionResult:
    """The caption of one image file, or the reason it could not be read."""

    path: Path
    caption: str | None = None
    words: list[str] | None = None
    generation: Generation | None = None
    error: str | None = None


def caption_files(model, vocab: Vocabulary, paths: Sequence[str | Path], settings: DecodeConfig, *,
                  batch_size: int = 16, max_pixels: int = 64_000_000) -> list[CaptionResult]:
    """Caption every readable file (in batches) as ``settings`` say; unreadable ones get ``error`` and the
    rest go on."""
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
            generations = decode(model.decoder, model.regions(images=images), vocab, settings,
                                 images=[str(result.path) for result, _ in chunk])
            for (result, _), generation in zip(chunk, generations):
                result.generation = generation
                result.words = [vocab.words[i] for i in generation.tokens]
                result.caption = " ".join(result.words)
    return results


def attention_maps(generation: Generation, grid: tuple[int, int], name: str = "alpha") -> torch.Tensor | None:
    """The per-word maps ``name`` of a generation as ``(T, gh, gw)`` (None when the decoder has none)."""
    maps = generation.attention.get(name)
    return None if maps is None else maps.reshape(-1, *grid)


def caption_json(result: CaptionResult, vocab: Vocabulary, grid: tuple[int, int], digits: int = 5) -> dict:
    """One captioned file as plain data: the caption, its words and log-probability, each word's attention
    maps as ``gh x gw`` nested lists (``"alpha"``; ``"chosen"`` for hard attention), and the n best captions."""
    generation = result.generation
    maps = {name: [[[round(v, digits) for v in row] for row in word] for word in attention_maps(generation, grid, name).tolist()]
            for name in generation.attention}
    return {"image": str(result.path), "caption": result.caption, "words": result.words,
            "log_prob": round(generation.log_prob, 4), "grid": list(grid), "attention": maps,
            "beams": [{"caption": vocab.decode(b.tokens), "log_prob": round(b.log_prob, 4)} for b in generation.beams]}


def attend_file(model, vocab: Vocabulary, image: str | Path, out: str | Path, settings: DecodeConfig, *,
                max_pixels: int = 64_000_000, instances: str | Path | None = None, title: str = "") -> CaptionResult:
    """Caption ``image`` and draw the paper-style attention figure into ``out``: the image, then each word's
    map (hard attention: its chosen cell too); with a COCO ``instances`` file, each word's panel outlines the
    boxes of the object it names. Raises :class:`~captioner.errors.ImageError` for an unreadable image."""
    (result,) = caption_files(model, vocab, [image], settings, max_pixels=max_pixels)
    if result.error:
        raise ImageError(result.error)
    boxes = boxes_of_named_objects(instances, image, result.words) if instances else None
    draw_generation_figure(load_image(image, max_pixels=max_pixels), result.words, result.generation,
                           model.encoder.grid, out, name=str(image), boxes=boxes, title=title + result.caption)
    return result


def draw_generation_figure(image: Image.Image, words: list[str], generation: Generation, grid: tuple[int, int],
                           out: str | Path, *, name: str, boxes=None, title: str = "") -> Path:
    """The paper-style figure of ``generation`` (its ``words``) on ``image`` into ``out``, the decoder's maps
    over its ``grid``; raises :class:`~captioner.errors.CaptionerError` (naming ``name``) when it has none."""
    # imported here: matplotlib takes ~0.4 s to import, a tenth of `captioner caption`'s whole run
    from captioner.visualisation.attention_figure import draw_attention_figure

    alpha = attention_maps(generation, grid, "alpha")
    chosen = attention_maps(generation, grid, "chosen")
    if alpha is None:
        raise CaptionerError(f"{name}: this model's decoder reports no attention maps to draw")
    return draw_attention_figure(image, words, alpha.numpy(), out, boxes=boxes,
                                 chosen=None if chosen is None else chosen.numpy(), title=title)
