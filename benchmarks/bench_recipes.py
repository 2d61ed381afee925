"""Training speed of shipped recipes against one another, as ratios measured in one run, printed as JSON.

Each recipe's decoder and loss, built as the recipe builds them, take training steps as the engine takes them
(forward, loss, backward, gradient clipping, fused Adam; float32) on one set of random captions of the paper's
lengths at the recipes' batch size, each over random features of its encoder's shape (VGG-19 conv5_4 at 224 px:
14 x 14 regions of 512; EfficientNet-Lite2 at 320 px: 10 x 10 of 1,280). The recipes' steps alternate round by
round, their order reversed every other round, so that the machine's drift hits all alike; each recipe's target
words/s is the median over the rounds, and its ratio to the first recipe's the median of the per-round ratios, with
their min-max. This times the decoder's step alone: an epoch also reads the cached features and validates, and a
CPU with native bf16 may train in bf16 (``train.amp: auto``). It writes ``benchmarks/results/recipe_speed.json``,
which the docs' results page renders as a table.

    python benchmarks/bench_recipes.py flickr8k_full_soft flickr8k_full_soft_lite2 [--vocab N] [--rounds N]
        [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
from common import FLICKR8K_VOCAB, add_arguments, machine_facts, random_captions, setup, training_step

from captioner.config import Config, load_config, recipes
from captioner.models.captioner import build_captioner
from captioner.objectives.losses import build_loss
from captioner.results.record import report
from captioner.training.engine import make_optimizer


def recipe_step(config: Config, vocab: int, batch: int, generator: torch.Generator):
    """``(step, facts)``: a function that takes one training step of the recipe ``config``'s decoder as the engine
    takes it (its optimizer, gradient clipping) on captions (B, T+2) over random features (B, L, D) of its encoder's
    shape, returning the target words; and the shapes it was built for."""
    model = build_captioner(dataclasses.replace(config.encoder, pretrained=False), config.model, vocab)  # its shape
    decoder, encoder = model.decoder.train(), model.encoder
    regions = encoder.grid[0] * encoder.grid[1]
    features = torch.randn(batch, regions, encoder.feature_dim, generator=generator)
    step = training_step(decoder, features, make_optimizer(model, config), build_loss(decoder, config.loss),
                         grad_clip=config.train.grad_clip)
    facts = {"encoder": config.encoder.name, "image_size": config.encoder.image_size, "regions": regions,
             "feature_dim": encoder.feature_dim, "epochs": config.train.epochs,
             "parameters": sum(p.numel() for p in decoder.parameters())}
    return step, facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="+", choices=sorted(recipes()), metavar="RECIPE",
                        help="two or more shipped recipes; the ratios are to the first")
    parser.add_argument("--vocab", type=int, default=FLICKR8K_VOCAB, help="words in the vocabulary (default: 2,543, "
                        "the full Flickr8k recipes' words seen 5 times or more)")
    parser.add_argument("--rounds", type=int, default=12, help="rounds of one step of each recipe (default 12)")
    add_arguments(parser, device=False)
    args = parser.parse_args()
    if len(args.recipes) < 2:
        parser.error("give two or more recipes: the ratios are to the first")
    setup(args)
    generator = torch.Generator().manual_seed(0)
    configs = {name: load_config(recipes()[name]) for name in args.recipes}
    batches = {config.train.batch_size for config in configs.values()}
    if len(batches) > 1:
        parser.error(f"the recipes train at different batch sizes ({sorted(batches)}): give recipes of one")
    captions = random_captions(batches.pop(), generator, args.vocab)       # the same captions for every recipe
    steps = {name: recipe_step(config, args.vocab, len(captions), generator) for name, config in configs.items()}
    for step, _ in steps.values():          # warm-up: allocator, kernels, Adam's state
        step(captions)
    rounds = 3 if args.quick else args.rounds
    speeds = {name: [] for name in steps}
    for round_ in range(rounds):
        order = list(steps) if round_ % 2 == 0 else list(reversed(steps))     # ABBA: neither always goes first
        for name in order:
            started = time.perf_counter()
            words = steps[name][0](captions)
            speeds[name].append(words / (time.perf_counter() - started))
    first = args.recipes[0]
    result = {}
    for name, (_, facts) in steps.items():
        ratios = [s / f for s, f in zip(speeds[name], speeds[first], strict=True)]
        result[name] = {**facts, "words_per_s": round(statistics.median(speeds[name]), 1),
                        "ratio_to_first": round(statistics.median(ratios), 3),
                        "ratio_min_max": [round(min(ratios), 3), round(max(ratios), 3)]}
    report("recipe_speed", {"rounds": rounds, "vocab": args.vocab, "batch": len(captions), "recipes": result,
                            "machine": machine_facts()},
           configs=args.recipes, probes=[f"train {name}" for name in args.recipes])


if __name__ == "__main__":
    main()
