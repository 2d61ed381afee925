"""What the commands' options share: argument types that refuse a bad value with one line, the help of the
arguments several commands take, and the predictor the captioning commands build from their options."""

from __future__ import annotations

import argparse
import json
import sys

CONFIG_HELP = "a YAML config, or the name of a recipe that ships with captioner (captioner config --list)"
RUNTIME_HELP = ("torch (default), or onnx: ONNX Runtime over the graphs of an export folder made with --onnx "
                "(captioner export)")
BEAM_HELP = "beam size (default: the config's decode.beam)"
MAX_PIXELS_HELP = "refuse larger images before decoding them (default: {}'s data.max_pixels, 64 megapixels)"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {value}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:      # NaN too
        raise argparse.ArgumentTypeError(f"must be at least 0, not {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


class Once(argparse.Action):
    """An option that may be given once: a second value is an error, not silently the one used."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest) is not None:
            parser.error(f"argument {option_string}: given twice")
        setattr(namespace, self.dest, values)


def add_overrides(parser: argparse.ArgumentParser, help: str = "overrides of the config") -> None:
    """The ``section.key=value`` words of a command that reads a config or a checkpoint (taken out of the line
    wherever they stand: :func:`captioner.cli.parse_args`)."""
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help=help)


def split_overrides(args: argparse.Namespace) -> list[str]:
    """The command's overrides, with ``--instances FILE`` as the split's ``data.instances``."""
    instances = getattr(args, "instances", None)
    return list(args.overrides) + ([f"data.instances={json.dumps({args.split: instances})}"] if instances else [])


def unreadable_exit(unreadable: list[str], readable: int | None = None) -> int:
    """1, with a closing line, when images were skipped as unreadable (each named in a warning), else 0."""
    if not unreadable:
        return 0
    rest = f"; the results cover the other {readable}" if readable is not None else "; the results cover the others"
    print(f"captioner: {len(unreadable)} unreadable image(s) skipped (named above){rest}", file=sys.stderr)
    return 1


def predictor_of(args: argparse.Namespace):
    """The :class:`~captioner.predictor.Predictor` of ``--checkpoint`` (several: an ensemble) with the overrides,
    ``--beam``, ``--n-best`` and ``--max-pixels``."""
    from captioner.core.devices import resolve_device
    from captioner.predictor import Predictor

    return Predictor.load(args.checkpoint, device=resolve_device(args.device), overrides=args.overrides,
                          beam=args.beam, n_best=getattr(args, "n_best", None), max_pixels=args.max_pixels,
                          runtime=getattr(args, "runtime", "torch"))
