"""``captioner serve``: a web page and JSON API over checkpoints (:func:`captioner.serve.app.serve`)."""

from __future__ import annotations

import argparse
import os
import re
from urllib.parse import urlsplit

from captioner.commands.options import (
    DEVICE_HELP,
    MAX_PIXELS_HELP,
    add_checkpoint,
    add_overrides,
    non_negative_float,
    positive_float,
    positive_int,
)

HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*")


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 (any free port) to 65535, not {value}")
    return value


def host_pattern(text: str) -> str:
    if text != "*" and not HOST_NAME.fullmatch(text.removeprefix("*.")):
        raise argparse.ArgumentTypeError(f"must be a host name (example.org), *.example.org or *, not {text!r}")
    return text


def origin(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise argparse.ArgumentTypeError(f"must be an origin such as http://localhost:3000, not {text!r}")
    return text.rstrip("/")


def add_parser(commands) -> None:
    parser = commands.add_parser("serve", help="a web page and JSON API: caption uploaded images, explore attention "
                                 "word by word")
    add_checkpoint(parser, "a trained checkpoint or export folder to serve; give it several times to serve them "
                   "side by side, each named by its run folder (the export folder's own name)", several=True,
                   positional=True)
    add_overrides(parser, "overrides of every checkpoint's config, e.g. decode.max_length=16")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=port, default=8000, help="port to listen on (0: any free port, announced "
                        "when the server starts; default: 8000)")
    parser.add_argument("--beam", type=positive_int, default=None, help="beam size when a request names none "
                        "(default: each config's decode.beam)")
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)
    add_limit_options(parser)
    add_access_options(parser)
    parser.set_defaults(func=run)


def add_limit_options(parser: argparse.ArgumentParser) -> None:
    """How much the server takes on: batches, uploads, images, the queue, the deadline; where it decodes."""
    parser.add_argument("--max-batch", type=positive_int, default=16, help="most images decoded as one batch")
    parser.add_argument("--max-wait-ms", type=non_negative_float, default=10.0,
                        help="longest a request waits for others to join its batch")
    parser.add_argument("--max-upload-mb", type=positive_float, default=20.0, help="larger uploads are refused (413)")
    parser.add_argument("--max-pixels", type=positive_int, default=None, help=MAX_PIXELS_HELP.format("each checkpoint"))
    parser.add_argument("--decode-in", choices=("process", "thread"), default="process",
                        help="process (default): the models decode in a child process of their own, so that decoding "
                             "never waits for the web server's Python; thread: in the server's own process")
    parser.add_argument("--max-queue", type=positive_int, default=64,
                        help="most caption and figure requests in the server at once (receiving, waiting, decoding); "
                             "more are refused at once with 503 and Retry-After (default: 64)")
    parser.add_argument("--timeout-s", type=positive_float, default=30.0,
                        help="a caption or figure request is answered within this many seconds of its headers: past "
                             "it, 408 when its upload had not arrived, else 504 (default: 30)")


def add_access_options(parser: argparse.ArgumentParser) -> None:
    """Who may talk to the server: Host names, the bearer token, CORS origins."""
    parser.add_argument("--allow-host", type=host_pattern, action="append", default=[], metavar="NAME",
                        help="another name the server answers to (repeatable; *.example.org: any under it, *: any); "
                             "requests naming others in their Host header are refused, against DNS rebinding "
                             "(default: localhost, any IP address, and --host when it is a name)")
    parser.add_argument("--token", default=None,
                        help="every API request must carry 'Authorization: Bearer TOKEN'; the page reads it from "
                             "its address, http://HOST:PORT/#token=TOKEN (default: the CAPTIONER_TOKEN environment "
                             "variable, else none: do not listen beyond this machine without one)")
    parser.add_argument("--cors-origin", type=origin, action="append", default=[], metavar="ORIGIN",
                        help="a web origin (http://localhost:3000) whose pages may call the API, with CORS headers "
                             "(repeatable; default: none, and POSTs from other origins are refused)")


def run(args: argparse.Namespace) -> int:
    from captioner.serve.access import TOKEN_VARIABLE
    from captioner.serve.app import serve

    serve(args.checkpoint, host=args.host, port=args.port, device=args.device, overrides=args.overrides,
          beam=args.beam, max_pixels=args.max_pixels, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
          max_upload_mb=args.max_upload_mb, decode_in=args.decode_in, max_queue=args.max_queue,
          timeout_s=args.timeout_s, allow_hosts=args.allow_host, cors_origins=args.cors_origin,
          token=args.token if args.token is not None else os.environ.get(TOKEN_VARIABLE))
    return 0
