"""``captioner attend``: caption one image and draw where the model looked for each word."""

from __future__ import annotations

import argparse

from captioner.commands.options import BEAM_HELP, MAX_PIXELS_HELP, Once, add_overrides, positive_int, predictor_of


def add_parser(commands) -> None:
    parser = commands.add_parser("attend", help="draw where the model looked for each word")
    parser.add_argument("image")
    parser.add_argument("--checkpoint", required=True, action=Once,
                        help="the trained checkpoint or export folder (one)")
    parser.add_argument("--out", required=True, help="output PNG")
    parser.add_argument("--instances", help="COCO instances_*.json holding this image (matched by file name): "
                        "outline the ground-truth box of each object a word names")
    add_overrides(parser, "overrides of the checkpoint's config, e.g. decode.max_length=16")
    parser.add_argument("--beam", type=int, default=None, help=BEAM_HELP)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-pixels", type=positive_int, default=None, help=MAX_PIXELS_HELP.format("the checkpoint"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = predictor_of(args).attend(args.image, args.out, instances=args.instances)
    print(f"{args.image}: {result.caption}\nwrote {args.out}")
    return 0
