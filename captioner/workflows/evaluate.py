"""Decoding a split with a checkpoint (several: an ensemble), scoring it and writing the COCO-format results: what
``captioner evaluate`` does; and what :mod:`captioner.workflows.ground` shares with it (the split's dataset, its
instances, unreadable images)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from captioner.errors import CaptionerError

if TYPE_CHECKING:
    from captioner.config import Config
    from captioner.data.dataset import CaptionDataset

log = logging.getLogger(__name__)


def split_dataset(config: Config, split: str, vocab, model) -> CaptionDataset:
    """One item per image of ``split``: cached features when the cache holds them all, else raw images."""
    from captioner.data.dataset import make_dataset
    from captioner.data.readers import read_split

    return make_dataset(config.data, read_split(config.data, split), vocab, model.encoder, pairs=False,
                        whole_cache_only=True)


def split_targets(config: Config, split: str, required: bool = False):
    """``(targets, image_sizes)`` of ``split`` from the config's ``data.instances`` file (shapes objects or
    COCO categories, see :func:`~captioner.evaluation.grounding.load_targets`), or ``(None, {})`` when it
    names none, or (unless ``required``) names one that is not there, with a warning."""
    from captioner.evaluation.grounding import load_instances

    instances = config.data.instances.get(split)
    if instances and not required and not Path(instances).is_file():
        log.warning("%s: instances file not found (data.instances); no shapes measures or grounding", instances)
        return None, {}
    return load_instances(instances)     # the file parsed once for both


def evaluate_checkpoint(checkpoints: str | Path | Sequence[str | Path], split: str = "test", *,
                        beam: int | None = None, out_dir: str | Path | None = None, overrides: Sequence[str] = (),
                        device: str = "auto", spice: bool = False, progress: bool = True,
                        n_best: int | None = None, runtime: str = "torch") -> dict:
    """Scores of the checkpoint (or the ensemble of ``checkpoints``) on ``split``; writes ``captions_{split}.json``
    (COCO results format), ``scores_{split}.json`` and, with ``n_best > 1``, ``nbest_{split}.json`` into
    ``out_dir`` (default: the first checkpoint's folder, or the export folder).

    The scores: BLEU-1..4, METEOR, ROUGE-L, CIDEr (SPICE on request), ``decode`` (the settings used),
    ``runtime``, ``diversity`` (:mod:`captioner.evaluation.diversity`), ``attention`` statistics, on the shapes
    data object precision and relation accuracy, and wherever the config names an instances file for the split,
    attention grounding (``pointing_accuracy``, ``grounding``)."""
    from captioner.checkpoint import checkpoint_digest, checkpoint_folder
    from captioner.core.devices import resolve_device
    from captioner.evaluation.caption_metrics import meteor_kept, score_captions
    from captioner.evaluation.diversity import diversity_measures, unseen_endings
    from captioner.evaluation.generate import caption_texts
    from captioner.predictor import Predictor

    refuse_file_as_folder(out_dir)
    predictor = Predictor.load(checkpoints, device=resolve_device(device), overrides=overrides, beam=beam,
                               n_best=n_best, runtime=runtime)
    model, vocab, config, decode_config = predictor.model, predictor.vocab, predictor.config, predictor.decode_config
    dataset = split_dataset(config, split, vocab, model)
    with meteor_kept():         # METEOR's Java process loads while the captions are decoded
        generations = predictor.generate(dataset, progress=progress)
        texts = caption_texts(generations, vocab)
        unreadable = unreadable_images(dataset, generations, split)
        scores = score_captions({r.image_id: r.captions for r in dataset.records}, texts, spice=spice)
    paths = [checkpoints] if isinstance(checkpoints, (str, Path)) else list(checkpoints)
    scores.update(images=len(texts), unreadable_images=unreadable, beam=decode_config.beam,
                  decode=asdict(decode_config),
                  checkpoint_sha256=[checkpoint_digest(path) for path in paths], overrides=list(overrides),
                  runtime=runtime,
                  diversity=diversity_measures(texts)
                  | ({"unseen_end": unseen_endings(texts, vocab)} if vocab.endings is not None else {}))
    scores.update(_attention_scores(generations, vocab, config, split, tuple(model.encoder.grid), texts))
    write_results(Path(out_dir) if out_dir else checkpoint_folder(paths[0]), split, scores, texts,
                  generations if decode_config.n_best > 1 else None, vocab)
    return scores


def write_results(out_dir: Path, split: str, scores: dict, texts: dict[int, str], generations: dict | None,
                  vocab) -> None:
    """``captions_{split}.json`` (COCO results format), ``scores_{split}.json`` and, given the ``generations``,
    the n best captions of every image with their log-probabilities, ``nbest_{split}.json``, into ``out_dir``."""
    from captioner.core.files import write_file
    from captioner.evaluation.caption_metrics import write_coco_results

    write_coco_results(texts, out_dir / f"captions_{split}.json")
    write_file(out_dir / f"scores_{split}.json", json.dumps(scores, indent=2))
    if generations is not None:
        nbest = [{"image_id": image_id, "beams": [{"caption": vocab.decode(b.tokens), "log_prob": b.log_prob}
                                                  for b in generation.beams]}
                 for image_id, generation in generations.items()]
        write_file(out_dir / f"nbest_{split}.json", json.dumps(nbest, indent=1))


def refuse_file_as_folder(out_dir: str | Path | None) -> None:
    """Fail before decoding, not after, when the output folder named is an existing file."""
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise CaptionerError(f"{out_dir}: is a file, not a folder")


def unreadable_images(dataset: CaptionDataset, decoded, split: str) -> list[str]:
    """The unreadable image files of ``dataset`` (each named in a warning as it was skipped); raises
    :class:`~captioner.errors.CaptionerError` when no image of ``split`` could be read."""
    unreadable = [str(record.path) for record in dataset.records if record.image_id not in decoded]
    if unreadable and len(unreadable) == len(dataset.records):
        raise CaptionerError(f"{unreadable[0]}: no image of split '{split}' could be read ({len(unreadable)} "
                             "unreadable: is data.images right?)")
    return unreadable


def _attention_scores(generations, vocab, config: Config, split: str, grid: tuple[int, int], texts: dict) -> dict:
    """Sharpness statistics, shapes measures and grounding, where they apply."""
    from captioner.evaluation.attention_stats import attention_statistics
    from captioner.evaluation.grounding import ShapesTargets, ground
    from captioner.evaluation.shapes_metrics import shapes_scores

    out = {}
    attention = attention_statistics(generations)
    if attention is not None:
        attention.pop("coverage")
        out["attention"] = attention
    targets, image_sizes = split_targets(config, split)
    if isinstance(targets, ShapesTargets):
        out.update(shapes_scores(texts, targets.objects))
    if targets is not None:
        grounding = ground(generations, vocab, targets, image_sizes, grid)
        if grounding is not None:
            out["pointing_accuracy"] = grounding["pointing_accuracy"]
            out["grounding"] = grounding
    return out
