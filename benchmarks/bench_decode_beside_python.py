"""Why ``captioner serve`` decodes in a process of its own, printed as JSON.

A batch of shapes images is captioned (encoder and beam search, ``--threads`` torch threads) in a loop: alone; beside
one busy pure-Python thread of the same process (as a web server's event loop is under load); beside one
busy process. Every PyTorch operator hands the interpreter lock back while it runs and takes it again; beside
a Python thread each of those takes waits for the thread to yield (every few milliseconds), and a beam
search runs thousands of operators. The three settings are measured in turn, ``--rounds`` times; the
median per image is reported with the ratios to decoding alone.

The model: the demo's trained soft-attention model (``runs/demo/soft/best.pt`` after ``make demo``) or
``--checkpoint``; without one, configs/demo_soft.yaml with random weights (short captions: fewer steps).

    python benchmarks/bench_decode_beside_python.py [--quick] [--threads 1] [--batch 8] [--rounds 3] [--checkpoint CKPT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from bench_serve import DEMO_SOFT, random_demo_checkpoint
from common import add_arguments
from captioner.results.record import report

from captioner.data.shapes import generate_shapes
from captioner.serve.checkpoints import load_served_models


def busy_python(stop) -> None:
    """Pure-Python work that holds the interpreter lock, as request handling does, until ``stop`` is set."""
    payload = {"attention": [0.123456] * 2000}
    while not stop.is_set():
        json.dumps(payload)


def ms_per_image(caption, batch: int, seconds: float) -> float:
    caption()
    started, calls = time.perf_counter(), 0
    while time.perf_counter() - started < seconds or calls < 2:
        caption()
        calls += 1
    return (time.perf_counter() - started) / calls / batch * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, device=False)
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="decoding time per setting and round")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 1.0
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        shapes = Path(folder) / "shapes"
        generate_shapes(shapes, seed=0, num_images=max(40, args.batch))
        checkpoint = args.checkpoint or (DEMO_SOFT if DEMO_SOFT.exists() else random_demo_checkpoint(Path(folder), shapes))
        served = next(iter(load_served_models([checkpoint], torch.device("cpu")).values()))
        paths = sorted((shapes / "images").rglob("*.png"))[:args.batch]
        images = [served.read(path.read_bytes(), path.name).pixels for path in paths]

        def caption():
            served.caption(images, served.decode_config.beam)

        def beside(kind: str) -> float:
            """ms per image while a busy Python ``thread`` or ``process`` runs."""
            context = threading if kind == "thread" else multiprocessing.get_context("spawn")
            stop = context.Event()
            worker = (threading.Thread if kind == "thread" else context.Process)(target=busy_python, args=(stop,))
            worker.start()
            try:
                return ms_per_image(caption, len(images), args.seconds)
            finally:
                stop.set()
                worker.join()

        settings = {"alone": lambda: ms_per_image(caption, len(images), args.seconds),
                    "beside_a_python_thread": lambda: beside("thread"),
                    "beside_a_python_process": lambda: beside("process")}
        measured: dict[str, list[float]] = {name: [] for name in settings}
        for _ in range(args.rounds):
            for name, run in settings.items():
                print(f"{name} ...", file=sys.stderr)
                measured[name].append(run())
    median = {name: statistics.median(values) for name, values in measured.items()}
    report("decode_beside_python", {
        "benchmark": "decode_beside_python", "checkpoint": str(checkpoint), "batch": len(images),
        "beam": served.decode_config.beam, "torch_threads": args.threads, "rounds": args.rounds,
        "ms_per_image": {name: round(value, 2) for name, value in median.items()},
        "ms_per_image_per_round": {name: [round(v, 2) for v in values] for name, values in measured.items()},
        "slowdown_beside_thread": round(median["beside_a_python_thread"] / median["alone"], 1),
        "slowdown_beside_process": round(median["beside_a_python_process"] / median["alone"], 2),
    }, configs=["demo_soft"], probes=["data demo_soft", "decode demo_soft data.features=features"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
