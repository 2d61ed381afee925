"""``captioner ground``: whether a checkpoint's attention falls on the objects its words name, measured on a split
against the instances file of its config or ``--instances``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from captioner.commands.evaluate import readable_or_refuse, refuse_file_as_folder, split_dataset, split_targets
from captioner.commands.options import BEAM_HELP, add_overrides, split_overrides, unreadable_exit
from captioner.errors import CaptionerError


def add_parser(commands) -> None:
    parser = commands.add_parser("ground", help="measure whether attention falls on the named objects (shapes data)")
    parser.add_argument("checkpoint")
    add_overrides(parser, "overrides of the checkpoint's config, e.g. data.features=null")
    parser.add_argument("--instances", help="COCO instances_*.json of the split (default: the config's "
                        "data.instances)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--beam", type=int, default=None, help=BEAM_HELP)
    parser.add_argument("--out", help="folder for grounding_SPLIT.json (default: the checkpoint's folder)")
    parser.add_argument("--references", action="store_true", help="ground the attention the model pays while it "
                        "reads the split's reference captions, not its own captions")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    parser.add_argument("--device", default="auto")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.evaluation.grounding import format_grounding

    grounding = ground_checkpoint(args.checkpoint, args.split, beam=args.beam, out_dir=args.out,
                                  overrides=split_overrides(args), device=args.device, references=args.references)
    print(json.dumps(grounding, indent=2) if args.json else format_grounding(grounding))
    return unreadable_exit(grounding["unreadable_images"])


def ground_checkpoint(checkpoint: str | Path, split: str = "test", *, beam: int | None = None,
                      out_dir: str | Path | None = None, overrides: Sequence[str] = (), device: str = "auto",
                      progress: bool = True, references: bool = False) -> dict:
    """Attention grounding of ``checkpoint``'s captions on ``split`` (with ``references``: of its attention while
    it reads the split's reference captions) against the instances file its config names (``data.instances``:
    shapes boxes or COCO masks); writes ``grounding_{split}.json`` (``grounding_references_{split}.json``) into
    ``out_dir`` (default: the checkpoint's folder, or the export folder itself), with the checkpoint's SHA-256 and
    the overrides, as evaluate records them."""
    from captioner.checkpoint import checkpoint_digest, checkpoint_folder
    from captioner.data.dataset import make_dataset
    from captioner.data.readers import read_split
    from captioner.evaluation.generate import read_references
    from captioner.evaluation.grounding import ground
    from captioner.predictor import Predictor
    from captioner.utils import resolve_device, write_file

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
