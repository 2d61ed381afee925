"""What setting up the process as a ``captioner`` command does (:func:`captioner.core.process.set_up_process`:
denormals flushed, freed memory kept by glibc for reuse) gives training steps, as ratios measured in one run, as JSON.

Each workload runs in fresh processes, two per round: one set up as every ``captioner`` command is, before torch
starts its threads, and one with Python's defaults, which is how a script that calls ``captioner.training.train``
without it ran (the studies' scripts before they set it up). A fresh process per measurement, because neither
setting can be taken back once torch's threads or the heap have it. The workloads: a cross-entropy step of each
recipe named (its decoder, loss, Adam and gradient clipping at random weights over random features of its encoder's
shape, as ``bench_recipes.py`` builds them, at the recipe's batch size), and with ``--scst RECIPE`` a self-critical
step of that recipe's decoder (5 captions of up to 16 words drawn per photo at its SCST batch size, CIDEr-D against
random references, the mean of the other samples as baseline, backward and Adam, as ``bench_scst.py`` takes it). Each process warms up
on two steps and times the next ones; its step time is their median. The two processes of a round run in
alternating order; a workload's speed-up is the median over the rounds of default time / set-up time, with its
min-max. Random weights have no denormals: the speed-up measured is the allocator's (``bench_denormal.py`` measures
the denormals' on a trained checkpoint).

    python benchmarks/bench_process_setup.py flickr8k_full_soft flickr8k_full_soft_lite2 [--scst RECIPE] [--rounds N]
        [--steps N] [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("set_up", "default")


def child(mode: str, recipe: str, workload: str, steps: int, threads: int) -> None:
    """Time ``steps`` steps of ``workload`` (``xe`` or ``scst``) of ``recipe`` in this fresh process, set up as
    ``mode`` says; print the seconds of each step as JSON."""
    if mode == "set_up":
        from captioner.core.process import set_up_process

        assert all(set_up_process().values()), "set_up_process did not take"
    import torch
    from common import FLICKR8K_VOCAB, random_captions

    from captioner.config import load_config, recipes

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    config = load_config(recipes()[recipe])
    if workload == "xe":
        from bench_recipes import recipe_step

        captions = random_captions(config.train.batch_size, generator, FLICKR8K_VOCAB)
        step, _ = recipe_step(config, FLICKR8K_VOCAB, len(captions), generator)

        def run() -> int:
            return step(captions)
    else:
        run = scst_step(config, generator)
    seconds = []
    for i in range(steps + 2):
        started = time.perf_counter()
        run()
        if i >= 2:                       # two warm-up steps: kernels, Adam's state
            seconds.append(time.perf_counter() - started)
    print(json.dumps(seconds))


def scst_step(config, generator):
    """One self-critical step of ``config``'s decoder at random weights, as :func:`bench_scst.one_step` takes it,
    over ``train.scst_batch_size`` photos of its encoder's shape."""
    import dataclasses

    import torch
    from bench_scst import one_step, synthetic_references
    from common import FLICKR8K_VOCAB

    from captioner.data.tokens import SPECIALS
    from captioner.data.vocabulary import Vocabulary
    from captioner.models.captioner import build_captioner
    from captioner.objectives.rewards import CiderD

    model = build_captioner(dataclasses.replace(config.encoder, pretrained=False), config.model, FLICKR8K_VOCAB)
    decoder, encoder = model.decoder.train(), model.encoder
    photos = config.train.scst_batch_size
    features = torch.randn(photos, encoder.grid[0] * encoder.grid[1], encoder.feature_dim, generator=generator)
    vocab = Vocabulary([*SPECIALS] + [f"w{i}" for i in range(len(SPECIALS), FLICKR8K_VOCAB)])
    cider = CiderD(synthetic_references(photos, generator), count_end=True)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=config.train.scst_lr)
    return lambda: one_step(decoder, features, cider, vocab, optimizer, torch.device("cpu"), greedy_baseline=False)


def measure(mode: str, recipe: str, workload: str, steps: int, threads: int) -> float:
    """The median step seconds of ``workload`` in a fresh process set up as ``mode``."""
    done = subprocess.run([sys.executable, __file__, "--child", mode, workload, recipe, "--steps", str(steps),
                           "--threads", str(threads)], capture_output=True, text=True, check=False,
                          cwd=Path(__file__).resolve().parent)
    if done.returncode:
        raise SystemExit(f"{workload} step of {recipe} ({mode}) failed:\n{done.stderr}")
    return statistics.median(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="*", default=["flickr8k_full_soft", "flickr8k_full_soft_lite2"],
                        metavar="RECIPE", help="shipped recipes (default: flickr8k_full_soft flickr8k_full_soft_lite2)")
    parser.add_argument("--scst", metavar="RECIPE", help="also a self-critical step of this recipe")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of one process per mode and workload (default 5)")
    parser.add_argument("--steps", type=int, default=4, help="steps timed in each process (default 4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each process (default 1)")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 steps: a check that it runs")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "WORKLOAD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.recipes[0], args.child[1], args.steps, args.threads)
        return

    import torch
    from common import machine_facts

    from captioner.config import recipes
    from captioner.results.record import report

    unknown = [name for name in [*args.recipes, *([args.scst] if args.scst else [])] if name not in recipes()]
    if unknown:
        parser.error(f"not a shipped recipe: {', '.join(unknown)}")
    rounds, steps = (2, 2) if args.quick else (args.rounds, args.steps)
    workloads = [(name, "xe") for name in args.recipes] + ([(args.scst, "scst")] if args.scst else [])
    times = {workload: {mode: [] for mode in MODES} for workload in workloads}
    for round_ in range(rounds):
        for recipe, workload in workloads:
            for mode in MODES if round_ % 2 == 0 else reversed(MODES):     # neither always goes first
                times[recipe, workload][mode].append(measure(mode, recipe, workload, steps, args.threads))
    result = []
    for (recipe, workload), seconds in times.items():
        speed_ups = [d / s for d, s in zip(seconds["default"], seconds["set_up"], strict=True)]
        result.append({"recipe": recipe, "step": workload,
                       "step_s": {mode: round(statistics.median(values), 3) for mode, values in seconds.items()},
                       "speed_up": round(statistics.median(speed_ups), 3),
                       "speed_up_min_max": [round(min(speed_ups), 3), round(max(speed_ups), 3)]})
    torch.set_num_threads(args.threads)
    report("process_setup", {"rounds": rounds, "steps_per_process": steps, "workloads": result,
                             "machine": machine_facts()},
           configs=sorted({recipe for recipe, _ in workloads}),
           probes=sorted({f"train {recipe}" for recipe, _ in workloads}))


if __name__ == "__main__":
    main()
