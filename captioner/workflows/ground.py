"""Attention grounding of a checkpoint on a split: whether its attention falls on the objects its words name (of its
own captions, or while it reads the references), against the instances file of its config; what
``captioner ground`` does."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from captioner.errors import CaptionerError
from captioner.workflows.evaluate import refuse_file_as_folder, split_dataset, split_targets, unreadable_images


def ground_checkpoint(checkpoint: str | Path, split: str = "test", *, beam: int | None = None,
                      out_dir: str | Path | None = None, overrides: Sequence[str] = (), device: str = "auto",
                      progress: bool = True, references: bool = False) -> dict:
    """Attention grounding of ``checkpoint``'s captions on ``split`` (with ``references``: of its attention while
    it reads the split's reference captions) against the instances file its config names (``data.instances``:
    shapes boxes or COCO masks); writes ``grounding_{split}.json`` (``grounding_references_{split}.json``) into
    ``out_dir`` (default: the checkpoint's folder, or the export folder itself), with the checkpoint's SHA-256 and
    the overrides, as evaluate records them."""
    from captioner.checkpoint import checkpoint_digest, checkpoint_folder
    from captioner.core.devices import resolve_device
    from captioner.core.files import write_file
    from captioner.data.dataset import make_dataset
    from captioner.data.readers import read_split
    from captioner.evaluation.generate import read_references
    from captioner.evaluation.grounding import ground
    from captioner.predictor import Predictor

    refuse_file_as_folder(out_dir)
    predictor = Predictor.load(checkpoint, device=resolve_device(device), overrides=overrides, beam=beam)
    model, vocab, config = predictor.model, predictor.vocab, predictor.config
    targets, image_sizes = split_targets(config, split, required=True)     # before decoding: a bad file fails at once
    if targets is None:
        raise CaptionerError(f"{checkpoint}: its config names no instances file for split '{split}' "
                             "(data.instances), so there are no objects to ground words in")
    if references:
        pairs = make_dataset(config.data, read_split(config.data, split), vocab, model.encoder, pairs=True,
                             whole_cache_only=True)
        generations = read_references(model, pairs)
        unreadable = unreadable_images(pairs, {image_id for image_id, _ in generations}, split)
    else:
        dataset = split_dataset(config, split, vocab, model)
        generations = predictor.generate(dataset, progress=progress)
        unreadable = unreadable_images(dataset, generations, split)
    grounding = ground(generations, vocab, targets, image_sizes, tuple(model.encoder.grid))
    if grounding is None:
        raise CaptionerError(f"{checkpoint}: this decoder reports no attention maps (model.lstm.attention=none)")
    grounding.update(unreadable_images=unreadable, checkpoint_sha256=[checkpoint_digest(checkpoint)],
                     overrides=list(overrides), references=references)
    out_dir = Path(out_dir) if out_dir else checkpoint_folder(checkpoint)
    name = f"grounding_references_{split}.json" if references else f"grounding_{split}.json"
    write_file(out_dir / name, json.dumps(grounding, indent=2))
    return grounding
