"""What denormal floats cost a trained model's training step on the CPU, as a ratio measured in one run, as JSON.

A checkpoint's model, its loss and its Adam state (as a resumed run has them) take full steps (forward, loss,
backward, Adam) on captions and cached features of its training split, in two fresh processes per round: one that
flushes denormals to zero as every ``captioner`` command does (:func:`captioner.core.floats.flush_denormals`, set
before torch's threads start) and one that keeps them. A fresh process per measurement, because the flag cannot be
taken back from torch's worker threads once they have it. Each process takes the same batches from the same
weights; the ratio of their target words/s is the median over the rounds with its min-max.

    python benchmarks/bench_denormal.py --checkpoint runs/flickr8k_full/soft_s0/best.pt [--threads N] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import add_arguments, machine_facts

from captioner.checkpoint import (
    build_checkpoint_model,
    load_checkpoint,
    model_and_loss_states,
)
from captioner.data.dataset import collate, make_dataset, visual_inputs
from captioner.data.readers import read_split
from captioner.objectives.losses import build_loss
from captioner.results.record import report
from captioner.training.engine import make_optimizer


def denormal_counts(payload: dict) -> dict[str, int]:
    """How many float32 values of the checkpoint's weights and of its Adam moments are denormal (nonzero, below
    the smallest normal float32)."""
    tiny = torch.finfo(torch.float32).tiny

    def count(tensors) -> int:
        return sum(int(((t != 0) & (t.abs() < tiny)).sum()) for t in tensors
                   if torch.is_tensor(t) and t.dtype == torch.float32)

    moments = [t for state in payload.get("optimizer", {}).get("state", {}).values() for t in state.values()]
    return {"weights": count(model_and_loss_states(payload)[0].values()), "adam_moments": count(moments)}


def measure(checkpoint: Path, steps: int, batch: int, threads: int, flush: bool) -> float:
    """Target words/s of ``steps`` training steps (after one to warm up) of the checkpoint, in this process."""
    if flush:
        from captioner.core.floats import flush_denormals

        flush_denormals()
    torch.set_num_threads(threads)
    payload = load_checkpoint(checkpoint)
    model, vocab, config = build_checkpoint_model(payload, checkpoint)
    model.train()
    loss_of = build_loss(model.decoder, config.loss)
    loss_state = model_and_loss_states(payload)[1]
    if loss_state:
        loss_of.load_state_dict(loss_state)
    optimizer = make_optimizer(model, config)
    if "optimizer" in payload:
        optimizer.load_state_dict(payload["optimizer"])
    dataset = make_dataset(config.data, read_split(config.data, "train"), vocab, model.encoder, pairs=True)
    picks = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[:batch * (steps + 1)].tolist()
    batches = [collate([dataset[i] for i in picks[start:start + batch]]) for start in range(0, len(picks), batch)]
    words, seconds = 0, 0.0
    for i, data in enumerate(batches):
        started = time.perf_counter()
        captions = data["captions"]
        loss = loss_of(model(captions, **visual_inputs(data, torch.device("cpu"))), captions[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss["loss"].backward()
        optimizer.step()
        if i:                                       # the first step warms up
            words, seconds = words + int(loss["words"]), seconds + time.perf_counter() - started
    return words / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, device=False)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a trained LSTM or Transformer checkpoint")
    parser.add_argument("--recipe", help="the recipe that trained it, named in the result")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=("flush", "keep"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps, batch = (3, 16) if args.quick else (8, 64)
    if args.child:
        print(measure(args.checkpoint, steps, batch, args.threads, args.child == "flush"))
        return
    rates = {"flush": [], "keep": []}
    for _ in range(args.rounds):
        for mode in rates:
            done = subprocess.run([sys.executable, __file__, "--checkpoint", str(args.checkpoint), "--threads",
                                   str(args.threads), "--child", mode, *(["--quick"] if args.quick else [])],
                                  capture_output=True, text=True, check=True)
            rates[mode].append(float(done.stdout.split()[-1]))
    ratios = [a / b for a, b in zip(rates["flush"], rates["keep"])]
    payload = load_checkpoint(args.checkpoint)
    result = {"checkpoint": args.checkpoint.name, "recipe": args.recipe,
              "decoder": payload["config"]["model"]["decoder"],
              "denormal_values": denormal_counts(payload),
              "rounds": args.rounds, "steps": steps, "batch": batch,
              "words_per_s": {mode: round(statistics.median(r), 1) for mode, r in rates.items()},
              "flush_over_keep": round(statistics.median(ratios), 3),
              "ratio_min_max": [round(min(ratios), 3), round(max(ratios), 3)], "machine": machine_facts()}
    if args.recipe:
        report("denormals", result, configs=[args.recipe], probes=[f"train {args.recipe}"])
    else:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
