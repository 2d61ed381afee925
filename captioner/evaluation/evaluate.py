"""``captioner evaluate``: decode a split with a checkpoint, write COCO-format results, score them."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from captioner.checkpoint import load_model
from captioner.data.dataset import CaptionDataset, make_dataset
from captioner.data.readers import read_split
from captioner.decoding.search import DecodeConfig
from captioner.errors import CaptionerError
from captioner.evaluation.attention_stats import attention_statistics
from captioner.evaluation.caption_metrics import score_captions, write_coco_results
from captioner.evaluation.generate import caption_texts, generate_captions
from captioner.evaluation.grounding import (
    ShapesTargets,
    ground,
    load_image_sizes,
    load_targets,
)
from captioner.evaluation.shapes_metrics import shapes_scores
from captioner.utils import resolve_device

log = logging.getLogger(__name__)


def split_dataset(config: dict, split: str, vocab, model) -> CaptionDataset:
    """One item per image of ``split``: cached features when the cache holds them all, else raw images."""
    return make_dataset(config, read_split(config["data"], split), vocab, model.encoder, pairs=False,
                        whole_cache_only=True)


def decode_split(checkpoint: str | Path, split: str, *, beam_size: int | None, overrides: Sequence[str],
                 device: str, progress: bool):
    """Load ``checkpoint`` (its config with ``overrides`` applied) and decode every image of ``split``:
    ``(model, vocab, config, dataset, generations, beam_size)``."""
    model, vocab, config, _ = load_model(checkpoint, resolve_device(device), overrides)
    settings = DecodeConfig.of(config, beam=beam_size)
    dataset = split_dataset(config, split, vocab, model)
    generations = generate_captions(model, dataset, vocab, settings, progress=progress)
    return model, vocab, config, dataset, generations, settings.beam


def _targets(config: dict, split: str):
    """``(targets, image_sizes)`` of ``split`` from the config's ``data.instances`` file (shapes objects or
    COCO categories, see :func:`~captioner.evaluation.grounding.load_targets`), or ``(None, {})``."""
    instances = (config["data"].get("instances") or {}).get(split)
    targets = load_targets(instances)
    return targets, (load_image_sizes(instances) if targets is not None else {})


def evaluate_checkpoint(checkpoint: str | Path, split: str = "test", *, beam_size: int | None = None,
                        out_dir: str | Path | None = None, overrides: Sequence[str] = (),
                        device: str = "auto", spice: bool = False, progress: bool = True) -> dict:
    """Scores of ``checkpoint`` on ``split``; writes ``captions_{split}.json`` (COCO results format) and
    ``scores_{split}.json`` into ``out_dir`` (default: the checkpoint's folder). On the shapes data the
    scores add object precision and relation accuracy; wherever the config names an instances file for the
    split (shapes or COCO), attention grounding (``pointing_accuracy`` and the ``grounding`` breakdown) of the
    images the file holds. ``attention`` holds the sharpness statistics of
    :func:`~captioner.evaluation.attention_stats.attention_statistics` (without the per-region list)."""
    model, vocab, config, dataset, generations, beam_size = decode_split(
        checkpoint, split, beam_size=beam_size, overrides=overrides, device=device, progress=progress)
    texts = caption_texts(generations, vocab)
    references = {r.image_id: r.captions for r in dataset.records}
    scores = score_captions(references, texts, spice=spice)
    attention = attention_statistics(generations)
    if attention is not None:
        attention.pop("coverage")
        scores["attention"] = attention
    targets, image_sizes = _targets(config, split)
    if isinstance(targets, ShapesTargets):
        scores.update(shapes_scores(texts, targets.objects))
    if targets is not None:
        grounding = ground(generations, vocab, targets, image_sizes, tuple(model.encoder.grid))
        if grounding is not None:
            scores["pointing_accuracy"] = grounding["pointing_accuracy"]
            scores["grounding"] = grounding
    scores["images"] = len(texts)
    scores["beam"] = beam_size
    out_dir = Path(out_dir) if out_dir else Path(checkpoint).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    write_coco_results(texts, out_dir / f"captions_{split}.json")
    (out_dir / f"scores_{split}.json").write_text(json.dumps(scores, indent=2))
    return scores


def ground_checkpoint(checkpoint: str | Path, split: str = "test", *, beam_size: int | None = None,
                      out_dir: str | Path | None = None, overrides: Sequence[str] = (), device: str = "auto",
                      progress: bool = True) -> dict:
    """Attention grounding of ``checkpoint``'s captions on ``split`` against the instances file its config
    names (``data.instances``: shapes boxes or COCO masks); writes ``grounding_{split}.json`` into
    ``out_dir`` (default: the checkpoint's folder)."""
    model, vocab, config, _, generations, _ = decode_split(
        checkpoint, split, beam_size=beam_size, overrides=overrides, device=device, progress=progress)
    targets, image_sizes = _targets(config, split)
    if targets is None:
        raise CaptionerError(f"{checkpoint}: its config names no instances file for split '{split}' "
                             "(data.instances), so there are no objects to ground words in")
    grounding = ground(generations, vocab, targets, image_sizes, tuple(model.encoder.grid))
    if grounding is None:
        raise CaptionerError(f"{checkpoint}: this decoder reports no attention maps (model.lstm.attention=none)")
    out_dir = Path(out_dir) if out_dir else Path(checkpoint).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"grounding_{split}.json").write_text(json.dumps(grounding, indent=2))
    return grounding
