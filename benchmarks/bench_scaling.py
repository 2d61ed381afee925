"""How cost grows, printed as JSON: training words/s of each decoder per batch size, beam-search images/s
per beam size and batch size, and the time of one training step of the soft-attention LSTM as caption
length T, regions L and batch B grow, with the fitted exponent ``k`` of ``time ~ x^k`` and the peak
memory of each measurement (CUDA: ``max_memory_allocated``; CPU: the process's peak private memory,
RssAnon, during the measurement, which includes what earlier measurements left allocated).

Decoders at the paper's sizes over L=196 regions of D=512 (VGG-19 conv5_4), vocabulary 10,000: soft and
hard attention LSTMs (attention, embedding and hidden size 512) and a 3-layer Transformer (d_model 512,
8 heads, FFN 2048). Runs on CUDA when present (``--device``).

    python benchmarks/bench_scaling.py [--quick] [--threads N] [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

import torch
from common import END, RULES, START, VOCAB, PeakMemory, add_arguments, random_captions, setup, synchronise

from captioner.config import load_config
from captioner.decoding.search import beam_search
from captioner.models.captioner import build_decoder
from captioner.objectives.losses import build_loss
from captioner.results.record import report

DECODERS = {   # the paper's sizes (the LSTM defaults), and a Transformer at its defaults
    "soft_lstm": [],
    "hard_lstm": ["model.lstm.attention_mode=hard"],
    "transformer": ["model.decoder=transformer", "loss.doubly_stochastic=0"],
}


def make_config(name: str) -> dict:
    return load_config(None, DECODERS[name])


def make_decoder(config: dict, regions: int, device: torch.device) -> torch.nn.Module:
    side = int(math.isqrt(regions))
    return build_decoder(config.model, VOCAB, 512, (side, regions // side)).to(device)


class Memory:
    """Peak memory of a block: CUDA's allocator peak, or this process's peak RssAnon on CPU."""

    def __init__(self, device: torch.device):
        self.device, self.mb = device, None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.sampler = PeakMemory().__enter__()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.mb = round(torch.cuda.max_memory_allocated(self.device) / 2**20)
        else:
            self.sampler.__exit__()
            self.mb = round(self.sampler.peak["RssAnon"] / 1024)


def fixed_captions(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``(batch, length+2)`` captions of exactly ``length`` random words."""
    captions = torch.full((batch, length + 2), END, dtype=torch.long)
    captions[:, 0] = START
    captions[:, 1:-1] = torch.randint(4, VOCAB, (batch, length), generator=generator)
    return captions


def step_seconds(decoder, config: dict, features: torch.Tensor, captions: list[torch.Tensor], device) -> tuple[float, int]:
    """Median seconds of one full training step over ``captions`` batches (after one warm-up), and words per step."""
    optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-4)
    decoder.train()
    loss_fn = build_loss(decoder, config.loss).to(device)
    times, words = [], 0
    for i, batch in enumerate(captions):
        batch = batch.to(device)
        synchronise(device)
        started = time.perf_counter()
        out = decoder(features, batch)
        losses = loss_fn(out, batch[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        optimizer.step()
        synchronise(device)
        if i > 0:
            times.append(time.perf_counter() - started)
            words = int(losses["words"])
    return statistics.median(times), words


def training_by_batch(device, batches: list[int], steps: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    result = {}
    for name in DECODERS:
        config = make_config(name)
        decoder = make_decoder(config, 196, device)
        for batch in batches:
            features = torch.randn(batch, 196, 512, generator=generator).to(device)
            captions = [random_captions(batch, generator) for _ in range(steps + 1)]
            with Memory(device) as memory:
                seconds, words = step_seconds(decoder, config, features, captions, device)
            result[f"{name} B={batch}"] = {"words_per_s": round(words / seconds, 1), "step_s": round(seconds, 4),
                                           "peak_memory_mb": memory.mb}
    return result


def beam_by_size(device, beams: list[int], batches: list[int], images: int) -> dict:
    config = make_config("soft_lstm")
    decoder = make_decoder(config, 196, device).eval()
    features = torch.randn(images, 196, 512).to(device)
    result = {}
    for beam in beams:
        for batch in batches:
            beam_search(decoder, features[:batch], beam=beam, max_length=20, rules=RULES)
            with Memory(device) as memory:
                synchronise(device)
                started = time.perf_counter()
                for i in range(0, images, batch):
                    beam_search(decoder, features[i : i + batch], beam=beam, max_length=20, rules=RULES)
                synchronise(device)
            result[f"k={beam} B={batch}"] = {"images_per_s": round(images / (time.perf_counter() - started), 2),
                                             "peak_memory_mb": memory.mb}
    return result


def fitted_exponent(xs: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(x)."""
    lx, ly = [math.log(x) for x in xs], [math.log(s) for s in seconds]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def growth(device, steps: int, quick: bool) -> dict:
    """Step time of the soft LSTM as one of T, L, B grows, the others at T=16, L=196, B=32."""
    config = make_config("soft_lstm")
    base = {"T": 16, "L": 196, "B": 32}
    ranges = {"T": [8, 16, 32], "L": [49, 196, 784], "B": [8, 32, 128]} if not quick else \
             {"T": [8, 16, 32], "L": [49, 196, 784], "B": [8, 32, 64]}
    generator = torch.Generator().manual_seed(0)
    result = {}
    for axis, values in ranges.items():
        rows = []
        for value in values:
            size = {**base, axis: value}
            decoder = make_decoder(config, size["L"], device)
            features = torch.randn(size["B"], size["L"], 512, generator=generator).to(device)
            captions = [fixed_captions(size["B"], size["T"], generator) for _ in range(steps + 1)]
            with Memory(device) as memory:
                seconds, _ = step_seconds(decoder, config, features, captions, device)
            rows.append({axis: value, "step_s": round(seconds, 4), "peak_memory_mb": memory.mb})
        exponent = fitted_exponent(values, [r["step_s"] for r in rows])
        result[axis] = {"rows": rows, "exponent": round(exponent, 2)}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)
    steps = 2 if args.quick else 5
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
              "training_by_batch": training_by_batch(device, [16, 64] if args.quick else [16, 64, 256], steps),
              "beam_by_size": beam_by_size(device, [1, 3, 5], [1, 32] if args.quick else [1, 32, 128],
                                           32 if args.quick else 256),
              "growth": growth(device, steps, args.quick)}
    configs = [" ".join(["defaults", *overrides]) for overrides in DECODERS.values()]
    report("scaling", result, configs=configs,
           probes=[f"train {c} data.features=features" for c in configs] + [
               f"decode {c} data.features=features" for c in (configs[0], configs[2])])


if __name__ == "__main__":
    main()
