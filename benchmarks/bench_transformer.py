"""Transformer decoder speed, printed as JSON: training words/s and beam-search images/s with and without
the key/value cache.

Configuration: L=196 regions of D=512, d_model 512, 3 layers, 8 heads, FFN 2048, 10,000 words.
Training: target words/s of a full step (forward, backward, Adam) at batch 32, captions of 10-22 words.
Beam search: k=3, batch 32, exactly 20 words per caption (``<end>`` gets probability 0, so no hypothesis
stops early). With the cache every step runs one position through the layers; without it every step
re-runs the whole prefix, cross-attention keys and values included. Both searches must return the same
captions; the speed-up is the ratio of their images/s.

    python benchmarks/bench_transformer.py [--quick] [--threads N] [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import platform
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
    random_captions,
    setup,
    training_step,
)

from captioner.decoding.search import beam_search
from captioner.models.transformer_decoder import (
    TransformerDecoder,
    TransformerDecoderConfig,
)

REGIONS, REGION_DIM = 196, 512


def synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_training(decoder: TransformerDecoder, device: torch.device, steps: int, batch: int = 32) -> dict:
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-4)
    features = torch.randn(batch, REGIONS, REGION_DIM, generator=generator).to(device)
    batches = [random_captions(batch, generator).to(device) for _ in range(steps + 1)]

    step = training_step(decoder, features, optimizer, doubly_stochastic=0.0)

    decoder.train()
    step(batches[0])  # warm-up
    synchronise(device)
    words, started = 0, time.perf_counter()
    for captions in batches[1:]:
        words += step(captions)
    synchronise(device)
    return {"words_per_s": round(words / (time.perf_counter() - started), 1), "steps": steps, "batch": batch}


def bench_beam(decoder, features: torch.Tensor, batch: int, beam: int = 3, length: int = 20) -> tuple[float, list]:
    """Images/s of beam search over ``features`` in batches, and the captions it found."""
    search = partial(beam_search, decoder, beam_size=beam, max_length=length, rules=RULES)
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
              "machine": platform.machine(), "config": asdict(config)}
    result["training"] = bench_training(decoder, device, steps=2 if args.quick else 4)

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
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
