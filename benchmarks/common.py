"""What the benchmark scripts share: the special word indices, random captions of the paper's lengths, a synthetic
feature cache, one teacher-forced training step, the CPU's fp32 matrix-multiply peak, a sampler of private memory, and
the emulation of a CPU with fewer vector extensions (``--isa``) with the facts of the machine a result came from."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from captioner.decoding.search import TokenRules
from captioner.models.encoder import build_encoder
from captioner.results.record import cpu_flags

START, END = 1, 2
RULES = TokenRules(START, END)    # no <unk> suppression: random captions have no <unk> anyway
VOCAB = 10_000
FLICKR8K_VOCAB = 2543   # the full Flickr8k recipes' words seen 5 times or more


def random_captions(batch: int, generator: torch.Generator, vocab: int = VOCAB) -> torch.Tensor:
    """``(batch, T+2)`` captions ``<start> w.. <end> <pad>..`` of 10-22 random words each."""
    lengths = torch.randint(10, 23, (batch,), generator=generator)
    captions = torch.zeros(batch, int(lengths.max()) + 2, dtype=torch.long)
    for row, n in enumerate(lengths.tolist()):
        captions[row, 0] = START
        captions[row, 1 : n + 1] = torch.randint(4, vocab, (n,), generator=generator)
        captions[row, n + 1] = END
    return captions


def write_synthetic_cache(folder: Path, image_ids: list[int], grid: tuple[int, int], dim: int,
                          encoder: dict | None = None, splits: tuple[str, ...] = ()) -> float:
    """A finished feature cache in :mod:`captioner.data.feature_cache`'s layout: a row ``(grid[0] * grid[1], dim)`` of
    fp16 features per image of ``image_ids`` (one random map, scaled differently per row), all marked written, its
    ``meta.json`` naming ``encoder`` (the config an encoder check compares) and ``splits``; returns its size in GB."""
    from captioner.data.feature_cache import WRITTEN

    folder.mkdir(parents=True, exist_ok=True)
    regions, images = grid[0] * grid[1], len(image_ids)
    features = np.lib.format.open_memmap(folder / "features.npy", mode="w+", dtype=np.float16,
                                         shape=(images, regions, dim))
    base = np.random.default_rng(0).standard_normal((regions, dim)).astype(np.float16)
    for start in range(0, images, 256):
        rows = min(256, images - start)
        features[start : start + rows] = base[None] * np.linspace(0.5, 1.5, rows, dtype=np.float16)[:, None, None]
        features.flush()
    del features
    np.save(folder / "status.npy", np.full(images, WRITTEN, dtype=np.uint8))
    meta = {"image_ids": list(image_ids), "grid": list(grid), "feature_dim": dim, "dtype": "float16",
            "encoder": encoder or {}, "splits": list(splits)}
    (folder / "meta.json").write_text(json.dumps(meta))
    return (folder / "features.npy").stat().st_size / 1e9


CAPTION_WORDS = (8, 16)
"""The fewest and most words of a stand-in caption (:func:`stand_in_flickr8k`)."""


def stand_in_split_file(path: Path, images: dict[str, int], vocab: int, generator: np.random.Generator) -> None:
    """A Karpathy split file of ``images`` per split, five captions of random words ``w0 .. w{vocab-1}`` each."""
    entries = []
    for split, count in images.items():
        for _ in range(count):
            lengths = generator.integers(CAPTION_WORDS[0], CAPTION_WORDS[1] + 1, size=5)
            sentences = [{"raw": " ".join(f"w{w}" for w in generator.integers(0, vocab, size=n))} for n in lengths]
            entries.append({"filename": f"{len(entries)}.jpg", "imgid": len(entries), "split": split,
                            "sentences": sentences})
    path.write_text(json.dumps({"images": entries}))


def stand_in_flickr8k(folder: Path, config, images: dict[str, int], generator: np.random.Generator) -> list[str]:
    """Data of the full Flickr8k's shape without its photos, in ``folder``: a split file of ``images`` per split
    (:func:`stand_in_split_file`, a vocabulary as large as the Flickr8k recipes') and a feature cache of them in the
    shape of ``config``'s encoder; returns the overrides that train ``config`` on it."""
    stand_in_split_file(folder / "dataset.json", images, FLICKR8K_VOCAB, generator)
    built = build_encoder(dataclasses.replace(config.encoder, pretrained=False))   # its grid and feature size
    write_synthetic_cache(folder / "features", list(range(sum(images.values()))), built.grid, built.feature_dim,
                          dataclasses.asdict(config.encoder), tuple(images))
    return [f"data.karpathy={folder / 'dataset.json'}", f"data.image_root={folder}",
            f"data.features={folder / 'features'}",
            "encoder.pretrained=false"]     # the features stand in for the encoder's: no weights needed


def training_step(decoder: torch.nn.Module, features: torch.Tensor, optimizer: torch.optim.Optimizer,
                  loss_of: Callable[[object, torch.Tensor], dict[str, torch.Tensor]],
                  grad_clip: float = 0.0) -> Callable[[torch.Tensor], int]:
    """A function that runs one full step (forward, loss, backward, gradient clipping at ``grad_clip`` where it is
    set, optimizer) of ``decoder`` on ``features`` (B, L, D) and captions (B, T+2), returning the number of target
    words. ``loss_of(teacher_forced, targets)`` gives ``{"loss", "words", ...}``, as the training losses
    (:func:`captioner.objectives.losses.build_loss`) do."""

    def step(captions: torch.Tensor) -> int:
        loss = loss_of(decoder(features, captions), captions[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss["loss"].backward()
        if grad_clip:
            torch.nn.utils.clip_grad_norm_(decoder.parameters(), grad_clip)
        optimizer.step()
        return int(loss["words"])

    return step


def synchronise(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA runs asynchronously; on a CPU nothing is queued)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak_gflops(device: torch.device | str = "cpu", size: int = 2048, repeats: int = 10) -> float:
    """GFLOP/s of a large fp32 matrix product on ``device`` (the CPU: on the current threads; CUDA: 8192 x 8192,
    synchronised, in torch's default fp32 matmul precision)."""
    device = torch.device(device)
    size = 8192 if device.type == "cuda" else size
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    a @ b
    synchronise(device)
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronise(device)
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
    from captioner.core.devices import resolve_device

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    return resolve_device(getattr(args, "device", "cpu"))


# What makes torch on an AVX-512 CPU run as on an AVX2-only one: ATen's own vectorised kernels (ATEN_CPU_CAPABILITY),
# oneDNN's (bf16 matrix products, convolutions) and MKL's code path. MKL honours MKL_ENABLE_INSTRUCTIONS on Intel
# processors only: on an AMD one it runs its Zen kernels, which are AVX2 (256-bit) whatever the CPU offers (on the
# 2-core AMD EPYC of 2026-11: mkl_blas_def_sgemm_kernel_0_zen, ymm registers only, the same speed with the variable
# set to SSE4_2 or AVX512), so there the float32 matrix products already are those of an AVX2 machine.
ISA_ENVIRONMENTS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def add_isa_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--isa", choices=("native", *ISA_ENVIRONMENTS), default="native",
                        help="native, or run as on a CPU with only these vector extensions (the script starts again "
                             "with " + "; ".join(f"{isa}: " + " ".join(f"{k}={v}" for k, v in env.items())
                                                    for isa, env in ISA_ENVIRONMENTS.items()) + ")")


def run_with_isa(isa: str) -> None:
    """Start this script again (``exec``, the same arguments) with the environment that emulates ``isa``, unless it
    is native or already set: the variables are read once, when torch first needs them."""
    wanted = ISA_ENVIRONMENTS.get(isa)
    if not wanted or all(os.environ.get(k) == v for k, v in wanted.items()):
        return
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **wanted})


def machine_facts(isa: str = "native") -> dict:
    """Where a result came from: the CPU's model and vector extensions, the ISA asked for and what torch uses
    (its kernels' capability, the environment variables set), the BLAS, threads, torch version, load average."""
    from captioner.core.devices import cpu_model

    env_names = sorted({k for env in ISA_ENVIRONMENTS.values() for k in env})
    return {"cpu": cpu_model(), "cpu_vector_flags": cpu_flags(), "isa": isa,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "isa_environment": {k: os.environ.get(k) for k in env_names},
            "fp32_matmul": "MKL" if torch.backends.mkl.is_available() else "other BLAS",
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "load_average": [round(x, 2) for x in os.getloadavg()]}
