"""What marginal attention costs beside soft attention, as ratios measured in one run, printed as JSON.

The decoder of ``flickr8k_full_soft`` (L = 196 regions of D = 512, as VGG-19 conv5_4 gives; sizes 512; the full
Flickr8k's 2,543 words) with its loss, soft against ``model.lstm.attention_mode=marginal`` over all 196 regions and
over the k regions of highest alpha (``model.lstm.marginal_regions``), alpha renormalised over them or with the
others' soft context as one more component (``model.lstm.marginal_rest=soft``, as ``flickr8k_full_marginal``).
Training: target words/s of a full step (forward, loss, backward, Adam) on random captions of 10-22 words.
Decoding: images/s of a beam-3 search of 16 words (a random model rarely ends, so every image runs the full length).
Each round runs every variant once, so that the machine's drift hits all alike; a variant's ratio to soft is the
median over the rounds with its min-max.

    python benchmarks/bench_marginal.py [--quick] [--threads N] [--rounds N] [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
from common import RULES, add_arguments, machine_facts, random_captions, setup, synchronise, training_step

from captioner.config import load_config
from captioner.decoding.search import beam_search
from captioner.models.lstm_decoder import LSTMDecoder
from captioner.objectives.losses import build_loss
from captioner.results.record import report

RECIPE = "flickr8k_full_soft"
VOCAB, GRID, REGION_DIM = 2543, (14, 14), 512


def variants(quick: bool) -> dict[str, list[str]]:
    """Each variant's overrides of the recipe, soft first."""
    marginal = ["model.lstm.attention_mode=marginal"]
    regions = (4, 16) if quick else (4, 16, 64)
    return {"soft": [], **{f"marginal, {k} regions": [*marginal, f"model.lstm.marginal_regions={k}"] for k in regions},
            "marginal, 4 regions and the soft rest": [*marginal, "model.lstm.marginal_regions=4",
                                                      "model.lstm.marginal_rest=soft"],
            "marginal, all 196 regions": marginal}


def decoder_and_loss(overrides: list[str], device: torch.device):
    config = load_config(RECIPE, overrides)
    torch.manual_seed(0)
    lstm = dataclasses.replace(config.model.lstm, vocab_size=VOCAB, region_dim=REGION_DIM, grid=GRID)
    decoder = LSTMDecoder(lstm).to(device)
    return decoder, build_loss(decoder, config.loss).to(device)


def timed(function, device: torch.device) -> float:
    synchronise(device)
    started = time.perf_counter()
    function()
    synchronise(device)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    device = setup(args)
    rounds, batch, images = (1, 16, 4) if args.quick else (args.rounds, 32, 8)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch, GRID[0] * GRID[1], REGION_DIM, generator=generator).to(device)
    captions = random_captions(batch, generator, VOCAB).to(device)
    built = {name: decoder_and_loss(overrides, device) for name, overrides in variants(args.quick).items()}
    steps = {name: training_step(decoder.train(), features, torch.optim.Adam(decoder.parameters(), lr=1e-4), loss)
             for name, (decoder, loss) in built.items()}
    for step in steps.values():             # warm up: first-call allocations and kernel choices
        step(captions)
    words = int((captions[:, 1:] != 0).sum())
    train_rates = {name: [] for name in built}
    decode_rates = {name: [] for name in built}
    for _ in range(rounds):
        for name, (decoder, _) in built.items():
            train_rates[name].append(words / timed(lambda: steps[name](captions), device))
            decoder.eval()
            with torch.no_grad():
                seconds = timed(lambda: beam_search(decoder, features[:images], beam=3, max_length=16, rules=RULES),
                                device)
            decoder.train()
            decode_rates[name].append(images / seconds)

    def summary(rates: dict[str, list[float]], name: str, unit: str) -> dict:
        ratios = [a / b for a, b in zip(rates[name], rates["soft"])]
        return {unit: round(statistics.median(rates[name]), 2), "ratio_to_soft": round(statistics.median(ratios), 3),
                "ratio_min_max": [round(min(ratios), 3), round(max(ratios), 3)]}

    result = {"recipe": RECIPE, "device": str(device), "rounds": rounds, "batch": batch, "words": words,
              "vocabulary": VOCAB, "regions": GRID[0] * GRID[1],
              "decode": {"beam": 3, "max_length": 16, "images": images},
              "variants": {name: {"overrides": variants(args.quick)[name],
                                  "training": summary(train_rates, name, "words_per_s"),
                                  "decoding": summary(decode_rates, name, "images_per_s")} for name in built},
              "machine": machine_facts()}
    configs = [" ".join([RECIPE, *overrides]) for overrides in variants(args.quick).values()]
    report("marginal_attention", result, configs=configs, probes=[f"train {c}" for c in configs])


if __name__ == "__main__":
    main()
