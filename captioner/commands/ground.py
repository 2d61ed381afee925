"""``captioner ground``: whether a checkpoint's attention falls on the objects its words name, measured on a split
against the instances file of its config or ``--instances`` (:func:`captioner.workflows.ground.ground_checkpoint`)."""

from __future__ import annotations

import argparse
import json

from captioner.commands.options import (
    BEAM_HELP,
    DEVICE_HELP,
    SPLIT_HELP,
    add_checkpoint,
    add_overrides,
    split_overrides,
    unreadable_exit,
)


def add_parser(commands) -> None:
    parser = commands.add_parser("ground", help="measure whether attention falls on the named objects (shapes data)")
    add_checkpoint(parser, "the trained checkpoint or export folder (one)", positional=True)
    add_overrides(parser, "overrides of the checkpoint's config, e.g. data.features=null")
    parser.add_argument("--instances", help="COCO instances_*.json of the split (default: the config's "
                        "data.instances)")
    parser.add_argument("--split", default="test", help=SPLIT_HELP)
    parser.add_argument("--beam", type=int, default=None, help=BEAM_HELP)
    parser.add_argument("--out", help="folder for grounding_SPLIT.json (default: the checkpoint's folder)")
    parser.add_argument("--references", action="store_true", help="ground the attention the model pays while it "
                        "reads the split's reference captions, not its own captions")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.evaluation.grounding import format_grounding
    from captioner.workflows.ground import ground_checkpoint

    grounding = ground_checkpoint(args.checkpoint, args.split, beam=args.beam, out_dir=args.out,
                                  overrides=split_overrides(args), device=args.device, references=args.references)
    print(json.dumps(grounding, indent=2) if args.json else format_grounding(grounding))
    return unreadable_exit(grounding["unreadable_images"])
