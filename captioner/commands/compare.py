"""``captioner compare``: a report comparing training runs (:mod:`captioner.workflows.report`): metrics, learning
curves, attention statistics, the same images captioned by every run."""

from __future__ import annotations

import argparse

from captioner.commands.options import non_negative_int


def add_parser(commands) -> None:
    parser = commands.add_parser("compare", help="report comparing runs: metrics, curves, attention statistics, "
                                 "figures")
    parser.add_argument("runs", nargs="+", help="run directories (with best.pt or last.pt) or export folders; a run "
                        "whose scores_SPLIT.json is not its checkpoint's with these decode settings is evaluated "
                        "again, which writes captions_SPLIT.json and scores_SPLIT.json into its folder as evaluate "
                        "does")
    parser.add_argument("--out", required=True, help="folder for report.md, report.html and the PNGs")
    parser.add_argument("--split", default="test", help="the split every run is scored and captioned on "
                        "(default: test)")
    parser.add_argument("--beam", type=int, default=None, help="beam size (default: each run's decode.beam)")
    parser.add_argument("--images", type=non_negative_int, default=3,
                        help="images of the split captioned by every run, with attention figures (0: none)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.workflows.report import write_report

    result = write_report(args.runs, args.out, split=args.split, beam=args.beam, images=args.images)
    print(f"wrote {result['markdown']} and {result['html']}")
    return 0
