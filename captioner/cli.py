"""The ``captioner`` command line: data (shapes, vocab, coco), config, cache-features, train, evaluate, ground,
caption, attend, export, compare, serve, demo, each a module of :mod:`captioner.commands` that adds its
sub-parser and runs it; this module assembles them, parses the line and turns user errors into one line.

Commands that read a config or a checkpoint take ``section.key=value`` overrides anywhere on the line
(before, between or after the options); every command checks them the same way (an unknown key is an
error naming it). Each command imports torch and what loads it only when it runs, so that ``captioner --help``
and argument errors do not wait for torch to load.

User errors (bad files, configs, checkpoints, unwritable folders, full disks) print one line naming the file and what is wrong and exit
with status 1; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys

from captioner.commands import (
    attend,
    cache_features,
    caption,
    compare,
    config,
    data,
    demo,
    evaluate,
    export,
    ground,
    serve,
    train,
)
from captioner.commands.options import check_line, required_after_parsing
from captioner.errors import CaptionerError
from captioner.version import __version__

COMMANDS = (data, config, cache_features, train, evaluate, ground, caption, attend, export, compare, serve, demo)
"""The command modules, in the order ``captioner --help`` lists them (see :mod:`captioner.commands`)."""


def build_parser() -> argparse.ArgumentParser:
    """The parser of the whole command line: the global options, then each command's sub-parser, added by its
    module's ``add_parser``."""
    parser = argparse.ArgumentParser(prog="captioner", description="Show, Attend and Tell image captioning.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--version", action="version", version=f"captioner {__version__}",
                        help="print captioner's version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                                     help="captioner COMMAND --help: its arguments and options")
    for command in COMMANDS:
        command.add_parser(commands)
    return parser


OVERRIDE = re.compile(r"^[A-Za-z_]\w*(\.\w+)+=")   # section.key=value (see captioner.config.parse_override)


def is_override(word: str) -> bool:
    """``section.key=value``, unless a file of that name exists (an image called ``shot.v=1.png``)."""
    return bool(OVERRIDE.match(word)) and not os.path.exists(word)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line; ``section.key=value`` words are taken out first, wherever they stand, and
    given to the commands that accept overrides (any other command refuses them); then each command's checks of
    the line as a whole run (:func:`captioner.commands.options.check_line`: ``--checkpoint``, the image files).
    No command: the help on stderr, and exit status 2, argparse's for a missing argument."""
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = [word for word in argv if is_override(word)]
    parser = build_parser()
    with required_after_parsing(parser):
        args = parser.parse_args([word for word in argv if not is_override(word)])
    if args.command is None:
        parser.print_help(sys.stderr)
        raise SystemExit(2)
    if overrides:
        if not hasattr(args, "overrides"):
            parser.error(f"'{args.command}' takes no section.key=value overrides (got {overrides[0]})")
        args.overrides = list(args.overrides) + overrides
    check_line(args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from captioner.core.console import LOG_FORMAT
    from captioner.core.process import set_up_process

    set_up_process()      # before any torch work, so that torch's worker threads inherit it (see its docstring)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        code = args.func(args)
        sys.stdout.flush()      # here, so that a reader gone away (| head) is seen below, not at exit
        return code
    except BrokenPipeError:     # the reader of our output has had enough: stop quietly, as a piped tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())    # no second error when Python exits
        return 128 + signal.SIGPIPE
    except CaptionerError as err:
        if args.debug:
            raise
        print(f"captioner: error: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # an unwritable folder, a full disk: the file and the reason, no traceback
        if args.debug:
            raise
        where = f"{err.filename}: " if err.filename else ""
        print(f"captioner: error: {where}{err.strerror or err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("captioner: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
