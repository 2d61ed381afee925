"""What the commands' options share: argument types that refuse a bad value with one line, the help of the
arguments several commands take, ``--checkpoint`` and the image files with the checks of a line as a whole
(:func:`check_line`), and the predictor the captioning commands build from their options."""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

CONFIG_HELP = "a YAML config, or the name of a recipe that ships with captioner (captioner config --list)"
RUNTIME_HELP = ("torch (default), or onnx: ONNX Runtime over the graphs of an export folder made with --onnx "
                "(captioner export)")
BEAM_HELP = "beam size (default: the config's decode.beam)"
MAX_PIXELS_HELP = "refuse larger images before decoding them (default: {}'s data.max_pixels, 64 megapixels)"
DEVICE_HELP = "where to run: auto (a GPU when CUDA works, else the CPU), cpu, cuda or cuda:N (default: auto)"
SPLIT_HELP = "the split of the checkpoint's data to decode: train, val or test (default: test)"

OLD_CHECKPOINT = "checkpoint_as_positional"
"""Where the checkpoint given the old way, as a positional argument, is parsed to (accepted for one release)."""
OLD_CHECKPOINT_NOTICE = ("captioner: the checkpoint as a positional argument is deprecated; give it as "
                         "--checkpoint PATH")


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
    parser.add_argument("overrides", nargs="*", default=[], metavar="section.key=value", help=help)


def add_check(parser: argparse.ArgumentParser, check: Callable[[argparse.ArgumentParser, argparse.Namespace], None]
              ) -> None:
    """Have :func:`check_line` call ``check(parser, args)`` once the line is parsed (it calls ``parser.error`` for a
    usage error, or completes ``args``)."""
    parser.set_defaults(checks=(*(parser.get_default("checks") or ()), lambda args: check(parser, args)))


def add_checkpoint(parser: argparse.ArgumentParser, help: str, *, several: bool = False,
                   positional: bool = False) -> None:
    """``--checkpoint PATH``, required: a list in ``args.checkpoint`` when ``several`` may be given (repeated), else
    the one path. ``positional``: the form of earlier releases, the checkpoint as a positional argument, is taken
    too, with a notice on stderr; both forms in one line are a usage error."""
    option = parser.add_argument("--checkpoint", required=True, action="append" if several else Once,
                                 metavar="PATH", help=help)
    _required_after_parsing(parser, option)
    if positional:
        old = parser.add_argument(OLD_CHECKPOINT, nargs="*" if several else "?", default=[] if several else None,
                                  metavar="CKPT", help="deprecated (accepted for this release, with a notice): the "
                                  "checkpoint as a positional argument; give it as --checkpoint PATH")
        old.left_out_of_usage = True
    add_check(parser, _check_checkpoint)


def add_images(parser: argparse.ArgumentParser, help: str) -> None:
    """The image files, one or more, as positional arguments (``args.images``); none is a usage error in words."""
    _required_after_parsing(parser, parser.add_argument("images", nargs="+", metavar="IMAGE", help=help))
    add_check(parser, _check_images)


def _check_checkpoint(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    old = vars(args).pop(OLD_CHECKPOINT, None)
    if old and args.checkpoint:
        parser.error("give the checkpoint once, as --checkpoint PATH, not also as a positional argument")
    if old:
        print(OLD_CHECKPOINT_NOTICE, file=sys.stderr)
        args.checkpoint = old
    if not args.checkpoint:
        named = next((word for word in getattr(args, "images", None) or () if _looks_like_checkpoint(word)), None)
        parser.error("give the checkpoint as --checkpoint PATH"
                     + (f" ({named} looks like a checkpoint, not an image)" if named else ""))


def _looks_like_checkpoint(word: str) -> bool:
    """A checkpoint file's name (``.pt``, ``.pth``) or an export folder (one with a ``config.json``)."""
    return Path(word).suffix in (".pt", ".pth") or (Path(word) / "config.json").is_file()


def _check_images(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.images:
        parser.error("give one or more image files")


def _required_after_parsing(parser: argparse.ArgumentParser, action: argparse.Action) -> None:
    """Mark ``action`` as required by its command's check, not by argparse (:func:`required_after_parsing`)."""
    action.required_after_parsing = True
    parser.formatter_class = _UsageFormatter


class _UsageFormatter(argparse.HelpFormatter):
    """The usage line with the arguments marked ``required_after_parsing`` shown as required, as they are, also
    while the line is parsed (``--help``, argparse's own errors), and without the old form of the checkpoint."""

    def add_usage(self, usage, actions, groups, prefix=None):
        shown = []
        for action in actions:
            if getattr(action, "left_out_of_usage", False):
                continue
            if getattr(action, "required_after_parsing", False):
                action = copy.copy(action)
                action.required = True
            shown.append(action)
        super().add_usage(usage, shown, groups, prefix)


def _every_action(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                yield from _every_action(command)


@contextmanager
def required_after_parsing(parser: argparse.ArgumentParser) -> Iterator[None]:
    """While the line is parsed, the arguments marked ``required_after_parsing`` are not required: their commands'
    checks (:func:`check_line`) require them, with a message in words and the old forms of the line allowed for.
    Everywhere else (``--help``, the usage line, the reference) they are required."""
    marked = [action for action in _every_action(parser) if getattr(action, "required_after_parsing", False)]
    for action in marked:
        action.required = False
    try:
        yield
    finally:
        for action in marked:
            action.required = True


def check_line(args: argparse.Namespace) -> None:
    """Run the checks the command added with :func:`add_check`, each on the line as a whole."""
    for check in getattr(args, "checks", ()):
        check(args)


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
    ``--beam``, ``--n-best`` and ``--max-pixels``; a model that knows only the synthetic shapes, given other images
    than the shapes data's own (``args.images``), says so in one warning line on stderr
    (:meth:`~captioner.predictor.Predictor.data_warning`)."""
    from captioner.core.devices import resolve_device
    from captioner.predictor import Predictor

    predictor = Predictor.load(args.checkpoint, device=resolve_device(args.device), overrides=args.overrides,
                               beam=args.beam, n_best=getattr(args, "n_best", None), max_pixels=args.max_pixels,
                               runtime=getattr(args, "runtime", "torch"))
    warning = predictor.data_warning(args.images)
    if warning:
        print(f"captioner: warning: {warning}", file=sys.stderr)
    return predictor
