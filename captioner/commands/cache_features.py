"""``captioner cache-features``: run a config's frozen encoder once over its images and store the region
features (:func:`captioner.training.features.cache_features`)."""

from __future__ import annotations

import argparse
import sys

from captioner.commands.options import CONFIG_HELP, add_overrides, positive_int


def add_parser(commands) -> None:
    parser = commands.add_parser("cache-features", help="run the frozen encoder once and store region features")
    parser.add_argument("config", help=CONFIG_HELP)
    add_overrides(parser)
    parser.add_argument("--splits", nargs="+", default=["train", "val", "test"],
                        help="the splits whose images are encoded (default: train val test)")
    parser.add_argument("--out", help="cache folder (default: data.features, or data.features/mirrored with --mirrored)")
    parser.add_argument("--mirrored", action="store_true",
                        help="encode each image flipped left to right (the cache that data.mirror reads)")
    parser.add_argument("--batch-size", type=positive_int, default=32,
                        help="images encoded at once (default: 32; smaller needs less memory)")
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16",
                        help="precision of the stored features (float16 halves the disk and page-cache footprint)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.config import load_config
    from captioner.training.features import cache_features

    result = cache_features(load_config(args.config, args.overrides), args.splits, args.out,
                            batch_size=args.batch_size, dtype=args.dtype, mirrored=args.mirrored)
    print(f"{result['folder']}: {result['written']} images written, {result['skipped']} already cached, "
          f"{len(result['failed'])} unreadable")
    for image_id, reason in result["failed"].items():
        print(f"  unreadable (id {image_id}): {reason}", file=sys.stderr)
    return 1 if result["failed"] else 0     # as caption and evaluate: the others are cached all the same
