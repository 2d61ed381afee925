"""``captioner train``: train a captioner from a config (:func:`captioner.training.engine.train`)."""

from __future__ import annotations

import argparse
import json

from captioner.commands.options import CONFIG_HELP, add_overrides


def add_parser(commands) -> None:
    parser = commands.add_parser("train", help="train a captioner")
    parser.add_argument("config", help=CONFIG_HELP)
    add_overrides(parser, "overrides, e.g. model.lstm.attention_dim=256 (anywhere on the line)")
    parser.add_argument("--resume", action="store_true", help="continue the run in run.out from last.pt")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run in run.out")
    parser.add_argument("--no-wandb", action="store_true", help="disable wandb logging")
    parser.add_argument("--strict", action="store_true", help="stop at the first unreadable or missing image "
                        "instead of skipping it (data.strict)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.config import load_config
    from captioner.training.engine import train

    overrides = (list(args.overrides) + (["train.wandb=disabled"] if args.no_wandb else [])
                 + (["data.strict=true"] if args.strict else []))
    config = load_config(args.config, overrides)
    result = train(config, resume=args.resume, overwrite=args.overwrite)
    print(json.dumps(result, indent=2))
    return 130 if result["stopped"] else 0
