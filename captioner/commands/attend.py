"""``captioner attend``: caption images and draw, for each, where the model looked for each word
(:func:`captioner.workflows.attend.attend_images`)."""

from __future__ import annotations

import argparse
import sys

from captioner.commands.options import (
    BEAM_HELP,
    DEVICE_HELP,
    MAX_PIXELS_HELP,
    add_checkpoint,
    add_images,
    add_overrides,
    positive_int,
    predictor_of,
)


def add_parser(commands) -> None:
    parser = commands.add_parser("attend", help="draw where the model looked for each word")
    add_images(parser, "the image files, one figure each; an unreadable one is named on stderr and the others are "
               "drawn (exit status 1)")
    add_checkpoint(parser, "the trained checkpoint or export folder (one)")
    parser.add_argument("--out", required=True, help="one image: the figure's PNG file (an existing folder: the "
                        "figure goes into it, named after the image); several: a folder, one PNG each named after its "
                        "image (photo.jpg -> photo.png; a name taken twice gets -2, -3)")
    parser.add_argument("--instances", help="COCO instances_*.json holding these images (matched by file name): "
                        "outline the ground-truth box of each object a word names")
    add_overrides(parser, "overrides of the checkpoint's config, e.g. decode.max_length=16")
    parser.add_argument("--beam", type=int, default=None, help=BEAM_HELP)
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    parser.add_argument("--max-pixels", type=positive_int, default=None, help=MAX_PIXELS_HELP.format("the checkpoint"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.workflows.attend import attend_images, figure_paths

    figures = figure_paths(args.images, args.out)       # a wrong --out refused before the model loads
    failed = 0
    for image, figure, result in attend_images(predictor_of(args), args.images, figures, instances=args.instances):
        if result.error:
            print(f"captioner: error: {result.error}", file=sys.stderr)
            failed += 1
        else:
            print(f"{image}: {result.caption}\nwrote {figure}")
    return 1 if failed else 0
