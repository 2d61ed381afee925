"""``captioner caption``: caption image files with a checkpoint or an export (several: an ensemble)."""

from __future__ import annotations

import argparse
import json
import sys

from captioner.commands.options import (
    BEAM_HELP,
    DEVICE_HELP,
    MAX_PIXELS_HELP,
    RUNTIME_HELP,
    add_checkpoint,
    add_images,
    add_overrides,
    positive_int,
    predictor_of,
)
from captioner.export import RUNTIMES


def add_parser(commands) -> None:
    parser = commands.add_parser("caption", help="caption image files")
    add_images(parser, "the image files to caption (any format PIL reads: PNG, JPEG, WebP, ...); an unreadable "
               "one is named on stderr and the others are captioned (exit status 1)")
    add_checkpoint(parser, "a trained checkpoint or export folder; give it several times for an ensemble (one "
                   "vocabulary and encoder)", several=True)
    add_overrides(parser, "overrides of the checkpoint's config, e.g. decode.max_length=16")
    parser.add_argument("--beam", type=int, default=None, help=BEAM_HELP)
    parser.add_argument("--n-best", type=int, default=None, help="the N best captions of each image, with their "
                        "log-probabilities (default: the config's decode.n_best, 1)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line (with per-word attention)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument("--max-pixels", type=positive_int, default=None, help=MAX_PIXELS_HELP.format("the checkpoint"))
    parser.add_argument("--runtime", choices=RUNTIMES, default="torch", help=RUNTIME_HELP)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.predictor import caption_json

    results = predictor_of(args).caption(args.images)
    for result in results:
        if result.error:
            print(f"captioner: error: {result.error}", file=sys.stderr)
        elif args.json:
            print(json.dumps(caption_json(result)))
        else:
            print(f"{result.path}: {result.caption}")
            for beam in result.beams[1:]:
                print(f"    {beam.log_prob:9.3f}  {beam.caption}")
    return 1 if any(r.error for r in results) else 0
