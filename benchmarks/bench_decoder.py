"""Decoder speed at the paper's configuration, printed as JSON.

Training: target words/s of a full step (forward, backward, Adam) of the soft-attention LSTM decoder on
cached features, L=196 regions of D=512, attention/embedding/LSTM size 512, 10,000 words, batch 32,
captions of 10-22 words. Beam search: images/s for k = 1, 3, 5 at batch 1 and 32, 20 steps (no early
<end>: a random model rarely ends, so every image runs the full length, the worst case).
The matmul peak is measured with a large fp32 matrix product on the same threads; the fraction of it
the training step reaches uses FLOPs counted by torch's FlopCounterMode.

    python benchmarks/bench_decoder.py [--quick] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
from common import (
    RULES,
    VOCAB,
    add_arguments,
    matmul_peak_gflops,
    random_captions,
    setup,
    training_step,
)
from torch.utils.flop_counter import FlopCounterMode

from captioner.decoding.search import beam_search
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig


def paper_decoder(region_dim: int = 512) -> LSTMDecoder:
    config = LSTMDecoderConfig(vocab_size=VOCAB, region_dim=region_dim, grid=(14, 14), attention="additive",
                               attention_dim=512, embed_dim=512, hidden_dim=512, dropout=0.5)
    return LSTMDecoder(config)


def bench_training(decoder: LSTMDecoder, steps: int, batch: int = 32) -> dict:
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-4)
    features = torch.randn(batch, 196, decoder.config.region_dim, generator=generator)
    batches = [random_captions(batch, generator) for _ in range(steps + 1)]

    step = training_step(decoder, features, optimizer, doubly_stochastic=1.0)

    decoder.train()
    step(batches[0])  # warm-up
    with FlopCounterMode(display=False) as counter:
        step(batches[0])
    flops_per_word = counter.get_total_flops() / int((batches[0][:, 1:] != 0).sum())
    words, started = 0, time.perf_counter()
    for captions in batches[1:]:
        words += step(captions)
    seconds = time.perf_counter() - started
    return {"words_per_s": round(words / seconds, 1), "gflops_per_s": round(words * flops_per_word / seconds / 1e9, 1),
            "steps": steps, "batch": batch}


def bench_beam(decoder: LSTMDecoder, beam: int, batch: int, images: int) -> float:
    decoder.eval()
    features = torch.randn(images, 196, decoder.config.region_dim)
    beam_search(decoder, features[:batch], beam_size=beam, max_length=20, rules=RULES)
    started = time.perf_counter()
    for i in range(0, images, batch):
        beam_search(decoder, features[i : i + batch], beam_size=beam, max_length=20, rules=RULES)
    return round(images / (time.perf_counter() - started), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, device=False)
    args = parser.parse_args()
    setup(args)
    steps, images = (3, 32) if args.quick else (10, 64)
    peak = matmul_peak_gflops()
    result = {"device": "cpu", "threads": torch.get_num_threads(), "torch": torch.__version__,
              "machine": platform.machine(), "matmul_peak_gflops": round(peak, 1), "training": {}, "beam_images_per_s": {}}
    for region_dim in (512, 2048):
        decoder = paper_decoder(region_dim)
        run = bench_training(decoder, steps)
        run["fraction_of_matmul_peak"] = round(run["gflops_per_s"] / peak, 3)
        result["training"][f"D={region_dim}"] = run
    decoder = paper_decoder(512)
    for beam in (1, 3, 5):
        for batch in (1, 32):
            result["beam_images_per_s"][f"k={beam},batch={batch}"] = bench_beam(decoder, beam, batch, images if batch > 1 else 8)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
