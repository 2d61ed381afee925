"""``captioner evaluate``: decode a split with a checkpoint, write COCO-format results, score them."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from captioner.checkpoint import checkpoint_digest, checkpoint_folder
from captioner.data.dataset import CaptionDataset, make_dataset
from captioner.data.readers import read_split
from captioner.errors import CaptionerError
from captioner.evaluation.attention_stats import attention_statistics
from captioner.evaluation.caption_metrics import meteor_kept, score_captions, write_coco_results
from captioner.evaluation.diversity import diversity_measures
from captioner.evaluation.generate import caption_texts, read_references
from captioner.evaluation.grounding import (
    ShapesTargets,
    ground,
    load_instances,
)
from captioner.evaluation.shapes_metrics import shapes_scores
from captioner.predictor import Predictor
from captioner.utils import resolve_device, write_file

if TYPE_CHECKING:
    from captioner.config import Config

log = logging.getLogger(__name__)


def split_dataset(config: Config, split: str, vocab, model) -> CaptionDataset:
    """One item per image of ``split``: cached features when the cache holds them all, else raw images."""
    return make_dataset(config.data, read_split(config.data, split), vocab, model.encoder, pairs=False,
                        whole_cache_only=True)


def _targets(config: Config, split: str, required: bool = False):
    """``(targets, image_sizes)`` of ``split`` from the config's ``data.instances`` file (shapes objects or
    COCO categories, see :func:`~captioner.evaluation.grounding.load_targets`), or ``(None, {})`` when it
    names none, or (unless ``required``) names one that is not there, with a warning."""
    instances = config.data.instances.get(split)
    if instances and not required and not Path(instances).is_file():
        log.warning("%s: instances file not found (data.instances); no shapes measures or grounding", instances)
        return None, {}
    return load_instances(instances)     # the file parsed once for both


def evaluate_checkpoint(checkpoints: str | Path | Sequence[str | Path], split: str = "test", *,
                        beam_size: int | None = None, out_dir: str | Path | None = None, overrides: Sequence[str] = (),
                        device: str = "auto", spice: bool = False, progress: bool = True,
                        n_best: int | None = None, runtime: str = "torch") -> dict:
    """Scores of the checkpoint (or the ensemble of ``checkpoints``) on ``split``; writes ``captions_{split}.json``
    (COCO results format) and ``scores_{split}.json`` into ``out_dir`` (default: the first checkpoint's folder, or the export folder itself),
    and with ``n_best > 1`` the n best captions of every image with their log-probabilities, ``nbest_{split}.json``.

    The scores: BLEU-1..4, METEOR, ROUGE-L, CIDEr (SPICE on request); ``decode``, the settings used, and
    ``runtime``, what ran the model (torch, or ONNX Runtime: :meth:`~captioner.predictor.Predictor.load`);
    ``diversity`` (:mod:`captioner.evaluation.diversity`); ``attention``, the sharpness statistics of
    :func:`~captioner.evaluation.attention_stats.attention_statistics` (without the per-region list); on the
    shapes data object precision and relation accuracy; wherever the config names an instances file for the
    split (shapes or COCO), attention grounding (``pointing_accuracy`` and the ``grounding`` breakdown) of the
    images the file holds."""
    refuse_file_as_folder(out_dir)
    predictor = Predictor.load(checkpoints, device=resolve_device(device), overrides=overrides, beam=beam_size,
                               n_best=n_best, runtime=runtime)
    model, vocab, config, settings = predictor.model, predictor.vocab, predictor.config, predictor.settings
    dataset = split_dataset(config, split, vocab, model)
    with meteor_kept():         # METEOR's Java process loads while the captions are decoded
        generations = predictor.generate(dataset, progress=progress)
        texts = caption_texts(generations, vocab)
        unreadable = readable_or_refuse(dataset, generations, split)
        scores = score_captions({r.image_id: r.captions for r in dataset.records}, texts, spice=spice)
    paths = [checkpoints] if isinstance(checkpoints, (str, Path)) else list(checkpoints)
    scores.update(images=len(texts), unreadable_images=unreadable, beam=settings.beam, decode=asdict(settings),
                  checkpoint_sha256=[checkpoint_digest(path) for path in paths], overrides=list(overrides),
                  runtime=runtime,
                  diversity=diversity_measures(texts))
    scores.update(_attention_scores(generations, vocab, config, split, tuple(model.encoder.grid), texts))
    out_dir = Path(out_dir) if out_dir else checkpoint_folder(paths[0])
    write_coco_results(texts, out_dir / f"captions_{split}.json")
    write_file(out_dir / f"scores_{split}.json", json.dumps(scores, indent=2))
    if settings.n_best > 1:
        nbest = [{"image_id": image_id, "beams": [{"caption": vocab.decode(b.tokens), "log_prob": b.log_prob}
                                                  for b in generation.beams]}
                 for image_id, generation in generations.items()]
        write_file(out_dir / f"nbest_{split}.json", json.dumps(nbest, indent=1))
    return scores


def refuse_file_as_folder(out_dir: str | Path | None) -> None:
    """Fail before decoding, not after, when the output folder named is an existing file."""
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise CaptionerError(f"{out_dir}: is a file, not a folder")


def readable_or_refuse(dataset: CaptionDataset, decoded, split: str) -> list[str]:
    """The unreadable image files of ``dataset`` (each named in a warning as it was skipped); raises
    :class:`~captioner.errors.CaptionerError` when no image of ``split`` could be read."""
    unreadable = [str(record.path) for record in dataset.records if record.image_id not in decoded]
    if unreadable and len(unreadable) == len(dataset.records):
        raise CaptionerError(f"{unreadable[0]}: no image of split '{split}' could be read ({len(unreadable)} "
                             "unreadable: is data.images right?)")
    return unreadable


def _attention_scores(generations, vocab, config: Config, split: str, grid: tuple[int, int], texts: dict) -> dict:
    """Sharpness statistics, shapes measures and grounding, where they apply."""
    out = {}
    attention = attention_statistics(generations)
    if attention is not None:
        attention.pop("coverage")
        out["attention"] = attention
    targets, image_sizes = _targets(config, split)
    if isinstance(targets, ShapesTargets):
        out.update(shapes_scores(texts, targets.objects))
    if targets is not None:
        grounding = ground(generations, vocab, targets, image_sizes, grid)
        if grounding is not None:
            out["pointing_accuracy"] = grounding["pointing_accuracy"]
            out["grounding"] = grounding
    return out


def ground_checkpoint(checkpoint: str | Path, split: str = "test", *, beam_size: int | None = None,
                      out_dir: str | Path | None = None, overrides: Sequence[str] = (), device: str = "auto",
                      progress: bool = True, references: bool = False) -> dict:
    """Attention grounding of ``checkpoint``'s captions on ``split`` (with ``references``: of its attention while
    it reads the split's reference captions) against the instances file its config names (``data.instances``:
    shapes boxes or COCO masks); writes ``grounding_{split}.json`` (``grounding_references_{split}.json``) into
    ``out_dir`` (default: the checkpoint's folder, or the export folder itself), with the checkpoint's SHA-256 and
    the overrides, as evaluate records them."""
    refuse_file_as_folder(out_dir)
    predictor = Predictor.load(checkpoint, device=resolve_device(device), overrides=overrides, beam=beam_size)
    model, vocab, config = predictor.model, predictor.vocab, predictor.config
    targets, image_sizes = _targets(config, split, required=True)     # before decoding: a bad file fails at once
    if targets is None:
        raise CaptionerError(f"{checkpoint}: its config names no instances file for split '{split}' "
                             "(data.instances), so there are no objects to ground words in")
    if references:
        pairs = make_dataset(config.data, read_split(config.data, split), vocab, model.encoder, pairs=True,
                             whole_cache_only=True)
        generations = read_references(model, pairs)
        unreadable = readable_or_refuse(pairs, {image_id for image_id, _ in generations}, split)
    else:
        dataset = split_dataset(config, split, vocab, model)
        generations = predictor.generate(dataset, progress=progress)
        unreadable = readable_or_refuse(dataset, generations, split)
    grounding = ground(generations, vocab, targets, image_sizes, tuple(model.encoder.grid))
    if grounding is None:
        raise CaptionerError(f"{checkpoint}: this decoder reports no attention maps (model.lstm.attention=none)")
    grounding.update(unreadable_images=unreadable, checkpoint_sha256=[checkpoint_digest(checkpoint)],
                     overrides=list(overrides), references=references)
    out_dir = Path(out_dir) if out_dir else checkpoint_folder(checkpoint)
    name = f"grounding_references_{split}.json" if references else f"grounding_{split}.json"
    write_file(out_dir / name, json.dumps(grounding, indent=2))
    return grounding
