"""Transformer decoder speed, printed as JSON: training words/s and beam-search images/s with and without
the key/value cache.

Configuration: L=196 regions of D=512, d_model 512, 3 layers, 8 heads, FFN 2048, 10,000 words.
Training: target words/s of a full step (forward, backward, Adam) at batch 32, captions of 10-22 words.
Beam search: k=3, batch 32, exactly 20 words per caption (``<end>`` gets probability 0, so no hypothesis
stops early). With the cache every step runs one position through the layers; without it every step
re-runs the whole prefix, cross-attention keys and values included. Both searches must return the same
captions; the speed-up is the ratio of their images/s.

Against the LSTM (``recipes_float32``): the training step of the ``flickr8k_transformer`` recipe's decoder against
that of ``flickr8k_soft``, each with its own loss section, at the recipes' sizes (VGG-19 regions 14 x 14 x 512,
batch 64, the Flickr8k-800 vocabulary's size), float32, the two stepped in turn on the same batches: target words/s
of each and their ratio per pair (above 1: the Transformer is faster).

    python benchmarks/bench_transformer.py [--quick] [--threads N] [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict
from functools import partial
from types import SimpleNamespace

import torch
from common import (
    END,
    RULES,
    VOCAB,
    add_arguments,
    machine_facts,
    random_captions,
    setup,
    synchronise,
    training_step,
)

from captioner.config import load_config
from captioner.decoding.search import beam_search
from captioner.models.captioner import build_decoder
from captioner.models.transformer_decoder import (
    TransformerDecoder,
    TransformerDecoderConfig,
)
from captioner.objectives.losses import build_loss, caption_loss
from captioner.results.record import report

REGIONS, REGION_DIM = 196, 512


def bench_training(decoder: TransformerDecoder, device: torch.device, steps: int, batch: int = 32) -> dict:
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-4)
    features = torch.randn(batch, REGIONS, REGION_DIM, generator=generator).to(device)
    batches = [random_captions(batch, generator).to(device) for _ in range(steps + 1)]

    step = training_step(decoder, features, optimizer,
                         lambda out, targets: caption_loss(out.logits, targets, out.alpha, doubly_stochastic=0.0))

    decoder.train()
    step(batches[0])  # warm-up
    synchronise(device)
    words, started = 0, time.perf_counter()
    for captions in batches[1:]:
        words += step(captions)
    synchronise(device)
    return {"words_per_s": round(words / (time.perf_counter() - started), 1), "steps": steps, "batch": batch}


FLICKR_VOCAB = 1_075     # words of the flickr8k-800 training captions seen 3+ times, specials included (the recipes')


def bench_recipes(device: torch.device, pairs: int, batch: int = 64) -> dict:
    """Training words/s of the two Flickr recipes' decoders and losses, stepped in turn (see the module docstring)."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch, REGIONS, REGION_DIM, generator=generator).to(device)
    steps, settings = {}, {}
    for name in ("flickr8k_soft", "flickr8k_transformer"):
        config = load_config(name, ["train.amp=false"])
        decoder = build_decoder(config.model, FLICKR_VOCAB, REGION_DIM, (14, 14)).to(device).train()
        optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-4, fused=device.type != "mps")
        steps[name] = training_step(decoder, features, optimizer, build_loss(decoder, config.loss))
        chosen = {k: v for k, v in asdict(config.model.chosen).items() if k not in ("vocab_size", "region_dim", "grid")}
        settings[name] = {"decoder": config.model.decoder, **chosen, "loss": asdict(config.loss)}
    batches = [random_captions(batch, generator, FLICKR_VOCAB).to(device) for _ in range(pairs + 1)]
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        step(batches[0])                      # warm-up
    for captions in batches[1:]:
        for name, step in steps.items():
            synchronise(device)
            started = time.perf_counter()
            words = step(captions)
            synchronise(device)
            rates[name].append(words / (time.perf_counter() - started))
    ratios = [t / s for s, t in zip(rates["flickr8k_soft"], rates["flickr8k_transformer"])]
    return {"words_per_s": {name: round(statistics.median(r), 1) for name, r in rates.items()},
            "transformer_over_lstm": {"median": round(statistics.median(ratios), 3), "min": round(min(ratios), 3),
                                      "max": round(max(ratios), 3)},
            "pairs": pairs, "batch": batch, "vocabulary": FLICKR_VOCAB, "settings": settings}


def bench_beam(decoder, features: torch.Tensor, batch: int, beam: int = 3, length: int = 20) -> tuple[float, list]:
    """Images/s of beam search over ``features`` in batches, and the captions it found."""
    search = partial(beam_search, decoder, beam=beam, max_length=length, rules=RULES)
    search(features[:2])  # warm-up
    synchronise(features.device)
    started = time.perf_counter()
    captions = [g.tokens for i in range(0, features.shape[0], batch) for g in search(features[i : i + batch])]
    synchronise(features.device)
    return round(features.shape[0] / (time.perf_counter() - started), 2), captions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)
    config = TransformerDecoderConfig(vocab_size=VOCAB, region_dim=REGION_DIM, grid=(14, 14), d_model=512, num_layers=3,
                                      num_heads=8, ffn_dim=2048, dropout=0.1)
    decoder = TransformerDecoder(config).to(device)
    result = {"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "machine": machine_facts(), "config": asdict(config)}
    result["training"] = bench_training(decoder, device, steps=2 if args.quick else 4)
    result["recipes_float32"] = bench_recipes(device, pairs=3 if args.quick else 9)

    decoder.eval()
    with torch.no_grad():
        decoder.out_words.bias[END] = float("-inf")   # every hypothesis runs the full 20 words
    features = torch.randn(32, REGIONS, REGION_DIM, generator=torch.Generator().manual_seed(1)).to(device)
    uncached = SimpleNamespace(init_state=partial(decoder.init_state, use_cache=False), step=decoder.step)
    cached_speed, cached_captions = bench_beam(decoder, features, batch=32)
    uncached_speed, uncached_captions = bench_beam(uncached, features, batch=32)
    result["beam_k3_batch32_20_words"] = {
        "images_per_s_cache": cached_speed, "images_per_s_no_cache": uncached_speed,
        "speed_up": round(cached_speed / uncached_speed, 2), "same_captions": cached_captions == uncached_captions,
        "words_per_caption": sorted({len(c) for c in cached_captions})}
    configs = ["flickr8k_transformer", "flickr8k_soft"]
    report("transformer_decoder", result, configs=configs,
           probes=[f"{probe} {c}" for c in configs for probe in ("train", "decode")])


if __name__ == "__main__":
    main()
