"""What the benchmark scripts share: the special word indices, random captions of the paper's lengths,
one teacher-forced training step, the CPU's fp32 matrix-multiply peak and a sampler of private memory."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from captioner.decoding.search import TokenRules
from captioner.training.losses import caption_loss

START, END = 1, 2
RULES = TokenRules(START, END)    # no <unk> suppression: random captions have no <unk> anyway
VOCAB = 10_000


def random_captions(batch: int, generator: torch.Generator, vocab: int = VOCAB) -> torch.Tensor:
    """``(batch, T+2)`` captions ``<start> w.. <end> <pad>..`` of 10-22 random words each."""
    lengths = torch.randint(10, 23, (batch,), generator=generator)
    captions = torch.zeros(batch, int(lengths.max()) + 2, dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        captions[row, 0] = START
        captions[row, 1 : n + 1] = torch.randint(4, vocab, (n,), generator=generator)
        captions[row, n + 1] = END
    return captions


def training_step(decoder: torch.nn.Module, features: torch.Tensor, optimizer: torch.optim.Optimizer,
                  doubly_stochastic: float) -> Callable[[torch.Tensor], int]:
    """A function that runs one full step (forward, loss, backward, optimizer) of ``decoder`` on ``features``
    (B, L, D) and captions (B, T+2), returning the number of target words."""

    def step(captions: torch.Tensor) -> int:
        out = decoder(features, captions)
        loss = caption_loss(out.logits, captions[:, 1:], out.alpha, doubly_stochastic)
        optimizer.zero_grad(set_to_none=True)
        loss["loss"].backward()
        optimizer.step()
        return int(loss["words"])

    return step


def matmul_peak_gflops(size: int = 2048, repeats: int = 10) -> float:
    """GFLOP/s of a large fp32 matrix product on the current threads."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - started) / 1e9


def memory_kib() -> dict[str, int]:
    """``{"RssAnon": kib, "RssFile": kib}`` of this process, from /proc/self/status (Linux)."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            values[key] = int(rest.split()[0])
    return values


class PeakMemory(threading.Thread):
    """Samples :func:`memory_kib` every ``interval`` seconds while running and keeps the peaks;
    use as a context manager."""

    def __init__(self, interval: float = 0.02):
        super().__init__(daemon=True)
        self.interval, self.running = interval, True
        self.before = memory_kib()
        self.peak = dict(self.before)

    def run(self) -> None:
        while self.running:
            for key, value in memory_kib().items():
                self.peak[key] = max(self.peak[key], value)
            time.sleep(self.interval)

    def __enter__(self) -> "PeakMemory":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.running = False
        self.join()


def add_arguments(parser: argparse.ArgumentParser, device: bool = True) -> None:
    """The options every benchmark takes: ``--quick``, ``--threads`` and (where it can use a GPU) ``--device``."""
    parser.add_argument("--quick", action="store_true", help="fewer and smaller measurements (rough numbers, fast)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    if device:
        parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N")


def setup(args: argparse.Namespace) -> torch.device:
    """Apply ``--threads``, seed torch, and return the device to measure on."""
    from captioner.utils import resolve_device

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    return resolve_device(getattr(args, "device", "cpu"))
