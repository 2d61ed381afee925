"""``captioner evaluate``: decode a split with a checkpoint (several: an ensemble), write COCO-format results,
score them (:func:`captioner.workflows.evaluate.evaluate_checkpoint`)."""

from __future__ import annotations

import argparse
import json

from captioner.commands.options import (
    BEAM_HELP,
    DEVICE_HELP,
    RUNTIME_HELP,
    SPLIT_HELP,
    add_checkpoint,
    add_overrides,
    split_overrides,
    unreadable_exit,
)
from captioner.export import RUNTIMES


def add_parser(commands) -> None:
    parser = commands.add_parser("evaluate", help="score a checkpoint (several: an ensemble) on a split (BLEU, METEOR, "
                                 "ROUGE-L, CIDEr, diversity, attention)")
    add_checkpoint(parser, "a trained checkpoint or export folder; give it several times for an ensemble (one "
                   "vocabulary and encoder)", several=True, positional=True)
    add_overrides(parser, "overrides of the checkpoint's config, e.g. data.features=null")
    parser.add_argument("--split", default="test", help=SPLIT_HELP)
    parser.add_argument("--beam", type=int, default=None, help=BEAM_HELP)
    parser.add_argument("--n-best", type=int, default=None, help="also write the N best captions of every image "
                        "with their log-probabilities (nbest_SPLIT.json)")
    parser.add_argument("--out", help="folder for captions_SPLIT.json and scores_SPLIT.json")
    parser.add_argument("--spice", action="store_true", help="also SPICE (needs Stanford CoreNLP)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument("--runtime", choices=RUNTIMES, default="torch", help=RUNTIME_HELP)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.workflows.evaluate import evaluate_checkpoint

    scores = evaluate_checkpoint(args.checkpoint, args.split, beam=args.beam, out_dir=args.out,
                                 overrides=split_overrides(args), device=args.device, spice=args.spice,
                                 n_best=args.n_best, runtime=args.runtime)
    print(json.dumps(scores, indent=2))
    return unreadable_exit(scores["unreadable_images"], scores["images"])
