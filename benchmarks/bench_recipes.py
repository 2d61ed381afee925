"""Training speed of shipped recipes against one another, as ratios measured in one run, printed as JSON.

Each recipe's decoder and loss, built as the recipe builds them, take full training steps (forward, loss, backward,
Adam; float32) on random features of the recipe's encoder's shape (its regions and their width: VGG-19 conv5_4 at
224 px gives 14 x 14 regions of 512, EfficientNet-Lite2 at 320 px 10 x 10 of 1,280) and random captions of the
paper's lengths, at the recipe's batch size. The steps alternate between the recipes, one of each per round, so that
the machine's drift hits all alike; each recipe's target words/s is the median over the rounds, and its ratio to
the first recipe's is the median of the per-round ratios, with their min-max. A recipe's training time is about its
epochs times its step's time: this says which recipe's epoch is the shorter on the machine at hand. It writes
``benchmarks/results/recipe_speed.json``, which the docs' results page renders as a table.

    python benchmarks/bench_recipes.py flickr8k_full_soft flickr8k_full_soft_lite2 [--vocab N] [--rounds N]
        [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch
from common import add_arguments, machine_facts, random_captions, setup, training_step

from captioner.config import load_config, recipes
from captioner.models.captioner import build_decoder
from captioner.models.encoder import build_encoder
from captioner.objectives.losses import build_loss
from captioner.results.record import report


def recipe_step(name: str, vocab: int, generator: torch.Generator):
    """``(step, captions, facts)``: one training step of recipe ``name``'s decoder over random features of its
    encoder's shape, the captions it trains on, and the shapes it was built for."""
    config = load_config(recipes()[name])
    encoder = build_encoder(dataclasses.replace(config.encoder, pretrained=False))     # its shape, not its weights
    decoder = build_decoder(config.model, vocab, encoder.feature_dim, encoder.grid)
    loss = build_loss(decoder, config.loss)
    batch = config.train.batch_size
    regions = encoder.grid[0] * encoder.grid[1]
    features = torch.randn(batch, regions, encoder.feature_dim, generator=generator)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=config.train.lr)
    step = training_step(decoder.train(), features, optimizer, lambda out, targets: loss(out, targets))
    captions = random_captions(batch, generator, vocab)
    facts = {"encoder": config.encoder.name, "image_size": config.encoder.image_size, "regions": regions,
             "feature_dim": encoder.feature_dim, "batch": batch, "epochs": config.train.epochs,
             "parameters": sum(p.numel() for p in decoder.parameters())}
    return step, captions, facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="+", choices=sorted(recipes()), metavar="RECIPE",
                        help="two or more shipped recipes; the ratios are to the first")
    parser.add_argument("--vocab", type=int, default=2543, help="words in the vocabulary (default: 2,543, the "
                        "full Flickr8k recipes' words seen 5 times or more)")
    parser.add_argument("--rounds", type=int, default=12, help="rounds of one step of each recipe (default 12)")
    add_arguments(parser, device=False)
    args = parser.parse_args()
    if len(args.recipes) < 2:
        parser.error("give two or more recipes: the ratios are to the first")
    setup(args)
    generator = torch.Generator().manual_seed(0)
    steps = {name: recipe_step(name, args.vocab, generator) for name in args.recipes}
    for step, captions, _ in steps.values():          # warm-up: allocator, kernels, Adam's state
        step(captions)
    rounds = 3 if args.quick else args.rounds
    speeds = {name: [] for name in steps}
    for _ in range(rounds):
        for name, (step, captions, _) in steps.items():
            started = time.perf_counter()
            words = step(captions)
            speeds[name].append(words / (time.perf_counter() - started))
    first = args.recipes[0]
    result = {}
    for name, (_, _, facts) in steps.items():
        ratios = [s / f for s, f in zip(speeds[name], speeds[first], strict=True)]
        result[name] = {**facts, "words_per_s": round(statistics.median(speeds[name]), 1),
                        "ratio_to_first": round(statistics.median(ratios), 3),
                        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)]}
    report("recipe_speed", {"rounds": rounds, "vocab": args.vocab, "recipes": result, "machine": machine_facts()},
           configs=args.recipes, probes=[f"train {name}" for name in args.recipes])


if __name__ == "__main__":
    main()
