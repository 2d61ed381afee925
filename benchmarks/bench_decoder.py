"""Decoder speed at the paper's configuration, as ratios measured in one run, printed as JSON.

Training: target words/s of a full step (forward, backward, Adam) of the soft-attention LSTM decoder on cached
features (L = 196 regions of D = 512 or 2048, attention/embedding/LSTM size 512, 10,000 words, batch 32,
captions of 10-22 words), against a reference of the common PyTorch tutorial's design
(``tutorial_reference.py``) on the same captions and regions: each pair is one step of the reference, then one
step of each captioner variant, so that the machine's drift hits all alike; the ratio is reported as the median
over the pairs with its min-max. Variants: ``fp32`` (the default), ``compiled`` (``train.compile``:
torch.compile of the recurrent step), ``bf16`` (``train.amp``: bfloat16 autocast). The FLOPs per target word of
our fp32 step and of the reference are those torch's FlopCounterMode counts (matrix products; real positions only:
nothing is spent on padding); ``flop_ratio``, the reference's over ours, is the ratio of words/s the two steps
would have at equal GFLOP/s; ``gflops_per_s`` says what each reaches, and the share of the fp32 matmul peak
ours.

Beam search: images/s for k = 1, 3, 5 at batch 1 and 32, 20 steps (a random model rarely ends, so every image
runs the full length). Fresh process: a k = 3, batch 32 search in a new Python process that sets up the
allocator as the command line does, against the same search in this warmed-up process, in pairs.

``--device cuda`` measures the training and beam-search parts on a GPU (``bf16``: CUDA autocast, as ``train.amp``
does there; times synchronised; the peak is that of a large fp32 product on the GPU, TF32 as torch's default).
``--isa avx2`` runs as on a CPU without AVX-512 (see ``common.ISA_ENVIRONMENTS``); the JSON's ``machine`` says
which CPU, vector extensions, torch kernels, threads and torch version the figures came from, with the load
average before and after (the figures are only comparable within one run).

    python benchmarks/bench_decoder.py [--quick] [--threads N] [--pairs N] [--isa avx2] [--only training beam fresh]
                                       [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import (
    RULES,
    VOCAB,
    add_arguments,
    add_isa_argument,
    machine_facts,
    matmul_peak_gflops,
    random_captions,
    run_with_isa,
    setup,
    synchronise,
)
from torch.utils.flop_counter import FlopCounterMode
from tutorial_reference import TutorialDecoder, tutorial_loss

from captioner.decoding.search import beam_search
from captioner.models.captioner import compile_decoder
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.objectives.losses import caption_loss
from captioner.results.record import report
from captioner.training.engine import autocast

HERE = Path(__file__).resolve().parent


def paper_decoder(region_dim: int = 512, device: torch.device | str = "cpu") -> LSTMDecoder:
    torch.manual_seed(0)
    return LSTMDecoder(LSTMDecoderConfig(vocab_size=VOCAB, region_dim=region_dim, grid=(14, 14))).to(device)


def our_step(decoder, features, optimizer, amp: bool = False):
    """One full training step of a captioner decoder; returns the target words."""
    def step(captions: torch.Tensor) -> int:
        with autocast(features.device, amp):
            out = decoder(features, captions)
            loss = caption_loss(out.logits, captions[:, 1:], out.alpha, 1.0)
        optimizer.zero_grad(set_to_none=True)
        loss["loss"].backward()
        optimizer.step()
        return int(loss["words"])
    return step


def tutorial_step(decoder, features, optimizer):
    def step(captions: torch.Tensor) -> int:
        scores, targets, lengths, alphas = decoder(features, captions)
        loss = tutorial_loss(scores, targets, lengths, alphas)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return sum(lengths)
    return step


def timed_words(step, captions) -> float:
    synchronise(captions.device)
    started = time.perf_counter()
    words = step(captions)
    synchronise(captions.device)
    return words / (time.perf_counter() - started)


def summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def bench_training(region_dim: int, pairs: int, peak: float, batch: int = 32,
                   device: torch.device = torch.device("cpu")) -> dict:
    """Words/s of the tutorial reference and of each captioner variant, step by step in turn."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(batch, 196, region_dim, generator=generator).to(device)
    reference = TutorialDecoder(VOCAB, region_dim=region_dim).to(device).train()
    steps = {"tutorial": tutorial_step(reference, features, torch.optim.Adam(reference.parameters(), lr=1e-4))}
    for name in ("fp32", "compiled", "bf16"):
        decoder = paper_decoder(region_dim, device).train()
        if name == "compiled" and not compile_decoder(decoder):
            continue
        optimizer = torch.optim.Adam(decoder.parameters(), lr=1e-4, fused=True)   # as the engine's make_optimizer
        steps[name] = our_step(decoder, features, optimizer, amp=name == "bf16")
    batches = [random_captions(batch, generator).to(device) for _ in range(pairs + 2)]
    for step in steps.values():   # warm-up (and compilation)
        step(batches[0])
        step(batches[1])
    rates = {name: [] for name in steps}
    for captions in batches[2:]:
        for name, step in steps.items():
            rates[name].append(timed_words(step, captions))
    flops_per_word = {}
    for name in ("fp32", "tutorial"):
        with FlopCounterMode(display=False) as counter:
            words = steps[name](batches[0])
        flops_per_word[name] = counter.get_total_flops() / words
    out = {"words_per_s": {name: summary(r) for name, r in rates.items()},
           "ratio_to_tutorial": {name: summary([a / b for a, b in zip(r, rates["tutorial"])])
                                 for name, r in rates.items() if name != "tutorial"},
           "mflop_per_word": {name: round(f / 1e6, 1) for name, f in flops_per_word.items()},
           # the ratio each step's words/s would have if both reached the same GFLOP/s
           "flop_ratio": round(flops_per_word["tutorial"] / flops_per_word["fp32"], 2),
           "gflops_per_s": {name: round(statistics.median(rates[name]) * f / 1e9, 1)
                            for name, f in flops_per_word.items()}}
    out["fp32_fraction_of_matmul_peak"] = round(out["gflops_per_s"]["fp32"] / peak, 3)
    return out


def bench_beam(decoder: LSTMDecoder, beam: int, batch: int, images: int) -> float:
    decoder.eval()
    device = next(decoder.parameters()).device
    features = torch.randn(images, 196, decoder.config.region_dim, device=device)
    beam_search(decoder, features[:batch], beam=beam, max_length=20, rules=RULES)
    synchronise(device)
    started = time.perf_counter()
    for i in range(0, images, batch):
        beam_search(decoder, features[i : i + batch], beam=beam, max_length=20, rules=RULES)
    synchronise(device)
    return round(images / (time.perf_counter() - started), 2)


FRESH = """
import time, torch
from captioner.core.memory import keep_freed_memory
if {allocator}:
    keep_freed_memory()
torch.set_num_threads({threads})
from bench_decoder import paper_decoder
from common import RULES
from captioner.decoding.search import beam_search
decoder = paper_decoder().eval()
features = torch.randn({images}, 196, 512, generator=torch.Generator().manual_seed(1))
started = time.perf_counter()
for i in range(0, {images}, 32):
    beam_search(decoder, features[i : i + 32], beam=3, max_length=20, rules=RULES)
print({images} / (time.perf_counter() - started))
"""


def fresh_images_per_s(images: int, allocator: bool) -> float:
    code = FRESH.format(allocator=allocator, threads=torch.get_num_threads(), images=images)
    # run from this folder: `python -c` imports from the working folder first (bench_decoder, common)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=HERE)
    return float(done.stdout.strip().splitlines()[-1])


def bench_fresh_process(pairs: int, images: int = 64) -> dict:
    """Beam search (k = 3, batch 32) images/s in a fresh process (with and without the command line's allocator
    set-up) against this warmed-up process, in turn."""
    decoder = paper_decoder().eval()
    features = torch.randn(images, 196, 512, generator=torch.Generator().manual_seed(1))
    warm, fresh, plain = [], [], []
    for _ in range(pairs):
        fresh.append(fresh_images_per_s(images, allocator=True))
        plain.append(fresh_images_per_s(images, allocator=False))
        started = time.perf_counter()
        for i in range(0, images, 32):
            beam_search(decoder, features[i : i + 32], beam=3, max_length=20, rules=RULES)
        warm.append(images / (time.perf_counter() - started))
    return {"warm_images_per_s": summary(warm), "fresh_images_per_s": summary(fresh),
            "fresh_without_allocator_setup_images_per_s": summary(plain),
            "fresh_to_warm": summary([f / w for f, w in zip(fresh, warm)]),
            "fresh_without_setup_to_warm": summary([f / w for f, w in zip(plain, warm)])}


PARTS = ("training", "fresh", "beam")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    add_isa_argument(parser)
    parser.add_argument("--pairs", type=int, default=None, help="interleaved measurements per ratio (default 5; 3 with --quick)")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=PARTS, help="the parts to measure (default all)")
    parser.add_argument("--dims", nargs="+", type=int, default=[512, 2048], help="region sizes D for training (default 512 2048)")
    args = parser.parse_args()
    run_with_isa(args.isa)
    device = setup(args)
    pairs = args.pairs or (3 if args.quick else 5)
    peak = matmul_peak_gflops(device)
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "threads": torch.get_num_threads(), "torch": torch.__version__,
              "machine": platform.machine(), "cpu": machine_facts(args.isa), "matmul_peak_gflops": round(peak, 1),
              "pairs": pairs}
    if "training" in args.only:
        result["training"] = {}
        for region_dim in args.dims:
            result["training"][f"D={region_dim}"] = bench_training(region_dim, pairs, peak, device=device)
    if "fresh" in args.only and device.type == "cpu":   # the command line's CPU allocator set-up
        result["fresh_process_beam"] = bench_fresh_process(pairs)
    if "beam" in args.only:
        result["beam_images_per_s"] = {}
        decoder = paper_decoder(512, device)
        for beam in (1, 3, 5):
            for batch in (1, 32):
                images = (32 if args.quick else 64) if batch > 1 else 8
                result["beam_images_per_s"][f"k={beam},batch={batch}"] = bench_beam(decoder, beam, batch, images)
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    report("lstm_decoder", result, configs=["defaults"],
           probes=["train defaults data.features=features", "decode defaults data.features=features"])


if __name__ == "__main__":
    main()
