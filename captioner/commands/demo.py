"""``captioner demo``: the main job on the embedded shapes data (:mod:`captioner.workflows.demo`): generate,
train, evaluate, draw, compare."""

from __future__ import annotations

import argparse
from pathlib import Path

from captioner.commands.options import positive_int


def add_parser(commands) -> None:
    parser = commands.add_parser("demo", help="the main job on the embedded shapes data: generate, train, evaluate, "
                                 "draw")
    parser.add_argument("--out", default="runs/demo", help="folder of the runs, their figures and the report "
                        "(default: runs/demo)")
    parser.add_argument("--data", default="data/shapes", help="folder of the shapes data, generated there unless "
                        "it holds the demo's set already (default: data/shapes)")
    parser.add_argument("--fast", action="store_true", help="a tiny run that only checks the pipeline")
    parser.add_argument("--seed", type=int, default=None, help="every run's run.seed (default: the configs', 0); "
                        "the shapes data stay the same")
    parser.add_argument("--runs", nargs="+", metavar="RUN", help="train only these runs (default: all of soft, "
                        "none, hard, transformer, soft_scst; soft_scst needs soft, trained now or before)")
    parser.add_argument("--processes", type=positive_int, default=None,
                        help="worker processes the runs train on: soft on all of them, data parallel, then the others "
                             "side by side, one each (default: one per usable CPU core, at most 4; 1 with a GPU); "
                             "1: one after the other in this process")
    parser.add_argument("--resume", action="store_true", help="continue each run from its last.pt where it has one "
                        "(after Ctrl-C: the same result as a demo never stopped) instead of starting it over")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.workflows.demo import DEMO_RUNS, run_demo

    run_demo(Path(args.out), data_dir=Path(args.data), fast=args.fast, runs=tuple(args.runs or DEMO_RUNS),
             seed=args.seed, processes=args.processes, resume=args.resume)
    return 0
