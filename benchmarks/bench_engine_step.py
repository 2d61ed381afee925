"""What the training engine adds to a recipe's bare training step, as ratios measured in one run, printed as JSON.

The engine's step (:func:`~captioner.training.engine.train_one_epoch`'s body: the next batch from the recipe's
loader over its feature cache, :func:`~captioner.training.engine.decoder_loss` and
:func:`~captioner.training.engine.optimizer_step`, with its gradient clipping, learning-rate schedule and moving
average of the weights where the recipe keeps one) against the bare step on the same batch: forward, loss, backward and
Adam on a batch already in memory. Both step one model, built by the engine from the recipe (its precision decided
as ``train.amp`` decides it), on stand-in data of the full Flickr8k's shape (random captions, synthetic features in
the recipe's encoder's shape, :func:`common.stand_in_flickr8k`). Rounds of ``--steps`` engine steps then the same
batches bare, the order swapped every other round, so that the machine's drift hits both alike; the ratio of bare to
engine time is the median over the rounds, with its min-max. Each part of the engine's step is timed too (the
loader's batch, the forward pass and loss, the backward pass and update), and after each bare step the parts the
bare step lacks, alone: the gradient clipping and the moving average's update.

    python benchmarks/bench_engine_step.py [CONFIG ...] [--rounds N] [--steps N] [--threads N] [--device auto]
        [--quick]       # --quick: rough numbers, printed and not saved
    python benchmarks/bench_engine_step.py flickr8k_full_soft "flickr8k_full_soft train.ema_decay=0.999"
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import add_arguments, machine_facts, setup, stand_in_flickr8k, synchronise

from captioner.config import apply_overrides
from captioner.core.devices import resolve_device, usable_cores
from captioner.core.process import set_up_process
from captioner.errors import CaptionerError
from captioner.results.fingerprint import ConfigRef, probe_name
from captioner.results.record import report
from captioner.training.averaging import WeightAverage
from captioner.training.distributed import World
from captioner.training.engine import TrainState, build_run, decide_precision, decoder_loss, optimizer_step
from captioner.training.run_io import GracefulStop

CONFIGS = ("flickr8k_full_soft", "flickr8k_full_transformer")
"""What ``make bench`` measures: the LSTM's and the Transformer's recipes."""
IMAGES = {"train": 1000, "val": 8}
"""Stand-in images per split: 5,000 training captions, 78 batches of 64."""


def clock(run) -> float:
    """``time.perf_counter()`` once ``run``'s device has done its queued work."""
    synchronise(run.device)
    return time.perf_counter()


def bare_step(run, batch: dict) -> tuple[dict[str, float], int]:
    """The engine's forward pass and loss (:func:`~captioner.training.engine.decoder_loss`), then backward and Adam
    alone, of ``run``'s model on ``batch``; the seconds of each part, and the target words."""
    times, started = {}, clock(run)
    losses = decoder_loss(run, batch)
    times["forward"] = clock(run) - started
    started = clock(run)
    run.optimizer.zero_grad(set_to_none=True)
    losses["loss"].backward()
    run.optimizer.step()
    times["backward_update"] = clock(run) - started
    return times, int(losses["words"])


def engine_step(run, state: TrainState, batches, stop: GracefulStop) -> dict[str, float]:
    """One step of the engine's epoch loop on the next batch of ``batches``; the seconds of each part."""
    started = clock(run)
    batch = next(batches)
    times = {"loader": clock(run) - started}
    started = clock(run)
    losses = decoder_loss(run, batch)
    times["forward"] = clock(run) - started
    started = clock(run)
    optimizer_step(run, state, losses, stop)
    losses["loss"].item()       # what the loop's progress bar reads
    times["backward_update"] = clock(run) - started
    return times


def extras(run, average: WeightAverage) -> dict[str, float]:
    """The seconds of what the engine's update adds to Adam, each alone: clipping the gradients (as
    ``train.grad_clip`` does, here at a norm no gradient reaches) and one update of the moving average."""
    started = clock(run)
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1e9)
    clip = clock(run) - started
    started = clock(run)
    average.update()
    return {"grad_clip": clip, "average_update": clock(run) - started}


def measure(config, rounds: int, steps: int, stop: GracefulStop) -> dict:
    """The engine's step against the bare step of one config (already pointed at stand-in data), in rounds."""
    run = build_run(config, World(), resolve_device(config.run.device), None)
    state = TrainState()
    run.precision = decide_precision(run, state)
    loader = run.loaders["xe"]
    if rounds * steps + 2 > len(loader):
        raise SystemExit(f"{rounds} rounds of {steps} steps need more than the stand-in's {len(loader)} batches")
    run.model.train()
    run.loss.train()
    loader.sampler.set_epoch(0)
    batches, same_batches = iter(loader), iter(loader)     # one order: the bare steps take the engine's batches
    average = run.average or WeightAverage(run.model, 0.999)    # timed alone: the config may keep none
    for _ in range(2):          # warm-up: allocator, kernels, Adam's state
        engine_step(run, state, batches, stop)
        bare_step(run, next(same_batches))
    parts = {"engine": [], "bare": [], "extras": []}
    ratios, words = [], 0
    for round_ in range(rounds):
        engine_times, bare_times = [], []
        for kind in ("engine", "bare") if round_ % 2 == 0 else ("bare", "engine"):
            for _ in range(steps):
                if kind == "engine":
                    engine_times.append(engine_step(run, state, batches, stop))
                    continue
                times, batch_words = bare_step(run, next(same_batches))
                bare_times.append(times)
                parts["extras"].append(extras(run, average))
                words += batch_words
        parts["engine"] += engine_times
        parts["bare"] += bare_times
        ratios.append(sum(sum(t.values()) for t in bare_times) / sum(sum(t.values()) for t in engine_times))
    engine_ms, bare_ms = median_ms(parts["engine"]), median_ms(parts["bare"])
    return {"precision": state.precision, "batch": loader.batch_size,
            "ema_decay": config.train.ema_decay, "grad_clip": config.train.grad_clip,
            "parameters": sum(p.numel() for p in run.model.parameters() if p.requires_grad),
            "target_words_per_step": round(words / (rounds * steps), 1),
            "engine_ms": {**engine_ms, "total": round(sum(engine_ms.values()), 2)},
            "bare_ms": {**bare_ms, "total": round(sum(bare_ms.values()), 2)},
            "extras_ms": median_ms(parts["extras"]),
            "bare_over_engine": round(statistics.median(ratios), 3),
            "bare_over_engine_min_max": [round(min(ratios), 3), round(max(ratios), 3)]}


def median_ms(times: list[dict]) -> dict[str, float]:
    """The median milliseconds of each part over ``times`` (dicts of seconds)."""
    return {key: round(1000 * statistics.median(t[key] for t in times), 2) for key in times[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", metavar="CONFIG", default=list(CONFIGS),
                        help="'RECIPE [OVERRIDE ...]', a shipped flickr8k_full_ recipe with settings on top "
                        f"(default: {', '.join(CONFIGS)})")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of engine and bare steps (default 8)")
    parser.add_argument("--steps", type=int, default=6, help="steps of each kind per round (default 6)")
    add_arguments(parser)
    parser.set_defaults(threads=usable_cores())
    args = parser.parse_args()
    set_up_process()        # as captioner train: its steps are the ones timed
    refs = [ConfigRef.parse(text) for text in args.configs]
    for ref in refs:
        if not ref.recipe.startswith("flickr8k_full_") or ref.init_from:
            parser.error(f"{ref.key}: give a flickr8k_full_ recipe that trains from scratch")
    device = setup(args)
    rounds, steps = (2, 3) if args.quick else (args.rounds, args.steps)
    workloads = []
    with GracefulStop() as stop:
        for ref in refs:
            try:
                config = ref.load()
            except (CaptionerError, KeyError) as err:
                parser.error(f"{ref.key}: {err}")
            with tempfile.TemporaryDirectory() as folder:
                folder = Path(folder)
                overrides = stand_in_flickr8k(folder, config, IMAGES, np.random.default_rng(0))
                config = apply_overrides(config, [*overrides, f"run.out={folder / 'run'}", f"run.device={device}",
                                                  "train.wandb=disabled"])
                workloads.append({"config": ref.key, **measure(config, rounds, steps, stop)})
    payload = {"rounds": rounds, "steps_per_round": steps, "workloads": workloads, "machine": machine_facts()}
    if args.quick:          # rough numbers: printed, not saved
        print(json.dumps(payload, indent=2))
        return
    report("engine_step", payload, configs=refs, probes=[probe_name("train", ref) for ref in refs])


if __name__ == "__main__":
    main()
