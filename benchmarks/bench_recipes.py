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
from common import add_arguments, machine_facts, random_captions, setup

from captioner.config import load_config, recipes
from captioner.models.captioner import build_decoder
from captioner.models.encoder import build_encoder
from captioner.objectives.losses import build_loss
from captioner.results.record import report


def recipe_step(name: str, vocab: int, captions: torch.Tensor, generator: torch.Generator):
    """``(step, facts)``: one training step of recipe ``name``'s decoder as the engine takes it (loss, backward,
    gradient clipping, fused Adam) on ``captions`` (B, T+2) over random features (B, L, D) of its encoder's shape,
    returning the target words; and the shapes it was built for."""
    config = load_config(recipes()[name])
    encoder = build_encoder(dataclasses.replace(config.encoder, pretrained=False))     # its shape, not its weights
    decoder = build_decoder(config.model, vocab, encoder.feature_dim, encoder.grid).train()
    loss_of = build_loss(decoder, config.loss)
    regions = encoder.grid[0] * encoder.grid[1]
    features = torch.randn(len(captions), regions, encoder.feature_dim, generator=generator)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay,
                                 fused=True)

    def step() -> int:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(decoder(features, captions), captions[:, 1:])
        loss["loss"].backward()
        if config.train.grad_clip:
            torch.nn.utils.clip_grad_norm_(decoder.parameters(), config.train.grad_clip)
        optimizer.step()
        return int(loss["words"])

    facts = {"encoder": config.encoder.name, "image_size": config.encoder.image_size, "regions": regions,
             "feature_dim": encoder.feature_dim, "epochs": config.train.epochs,
             "parameters": sum(p.numel() for p in decoder.parameters())}
    return step, facts


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
    batches = {load_config(recipes()[name]).train.batch_size for name in args.recipes}
    if len(batches) > 1:
        parser.error(f"the recipes train at different batch sizes ({sorted(batches)}): give recipes of one")
    captions = random_captions(batches.pop(), generator, args.vocab)       # the same captions for every recipe
    steps = {name: recipe_step(name, args.vocab, captions, generator) for name in args.recipes}
    for step, _ in steps.values():          # warm-up: allocator, kernels, Adam's state
        step()
    rounds = 3 if args.quick else args.rounds
    speeds = {name: [] for name in steps}
    for round_ in range(rounds):
        order = list(steps) if round_ % 2 == 0 else list(reversed(steps))     # ABBA: neither always goes first
        for name in order:
            started = time.perf_counter()
            words = steps[name][0]()
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
