"""Which precision a training run computes in: ``train.amp`` true, false or ``auto`` (the default).

On CUDA ``auto`` is mixed precision (bf16 where the GPU supports it, else fp16 with a gradient scaler). On a
CPU without native bf16 arithmetic (x86 without AVX512-BF16 or AMX, ARM without FEAT_BF16) bf16 is emulated and
many times slower, so ``auto`` takes float32 without measuring. Where the CPU has native bf16, whether it pays
depends on the sizes, so ``auto`` times a few training steps of the run's own model in float32 and in bf16
autocast (:func:`bf16_step_ratio`) and takes bf16 only below :data:`AUTO_BF16_BELOW`; the measurement leaves
the weights, the loss's state and the run's random streams alone. ``true`` on a CPU where bf16 is slower warns
with the measured ratio.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

AUTO_BF16_BELOW = 0.8       # auto takes bf16 on a CPU when its step takes less than this share of float32's
PROBE_BATCH = 32            # captions per probe step (at most the run's batch)
PROBE_WORDS = 12            # words per probe caption
PROBE_PAIRS = 8             # interleaved float32 / bf16 pairs, fewer (at least PROBE_MIN_PAIRS) after PROBE_SECONDS
PROBE_MIN_PAIRS = 4         # two pairs of a large decoder on a loaded machine chose wrongly one time in ten
PROBE_SECONDS = 5.0
CPUINFO = Path("/proc/cpuinfo")     # Linux: the CPU's flags


def amp_dtype(device: torch.device) -> torch.dtype:
    """The low precision of mixed precision on ``device``: bf16 on the CPU and on GPUs that support it, else fp16."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def precision_name(amp: bool, device: torch.device) -> str:
    """What a run with mixed precision ``amp`` on ``device`` computes its matrix products in: ``float32``, ``bf16``
    or ``fp16`` (:func:`amp_dtype`)."""
    if not amp:
        return "float32"
    return "fp16" if amp_dtype(device) == torch.float16 else "bf16"


def autocast(device: torch.device, enabled: bool):
    """Mixed precision in :func:`amp_dtype` (fp16 with a gradient scaler). Matrix products run in the low
    precision; softmax, log-softmax and the losses stay float32 (autocast's lists, and the decoders and losses
    cast to float32 where they normalise)."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=amp_dtype(device))


def native_bf16_cpu() -> tuple[bool | None, str]:
    """Whether this CPU computes in bf16 natively, and the evidence: ``True`` with the flag found (x86
    ``avx512_bf16`` or ``amx_bf16``; ARM ``bf16`` / FEAT_BF16), ``False`` where the CPU's flags are known and
    lack them, ``None`` where they cannot be read (then only a measurement tells)."""
    machine = platform.machine().lower()
    if CPUINFO.is_file():
        flags: set[str] = set()
        for line in CPUINFO.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() in ("flags", "features"):
                flags.update(value.split())
                break
        if not flags:
            return None, "no CPU flags in /proc/cpuinfo"
        native = sorted(flags & {"avx512_bf16", "amx_bf16", "bf16"})
        if native:
            return True, f"the CPU has {', '.join(native)}"
        arch = "ARM" if machine in ("aarch64", "arm64") else "x86"
        wanted = "bf16 (FEAT_BF16)" if arch == "ARM" else "avx512_bf16 or amx_bf16"
        return False, f"the CPU has no native bf16 ({wanted} not among its flags)"
    if platform.system() == "Darwin" and machine == "arm64":
        try:
            answer = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True,
                                    timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            answer = ""
        if answer in ("0", "1"):
            return answer == "1", ("the CPU has FEAT_BF16" if answer == "1"
                                   else "the CPU has no native bf16 (no FEAT_BF16)")
    return None, "the CPU's flags cannot be read here"


@dataclass(frozen=True)
class Precision:
    """The precision a run trains in and why, as its start-up line says it."""

    amp: bool
    reason: str

    def describe(self, device: torch.device) -> str:
        kind = "float32"
        if self.amp:
            kind = {torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast with a gradient scaler"}[
                amp_dtype(device)]
        return f"{kind} ({self.reason})"


def choose_precision(setting: bool | str, model: nn.Module, loss: nn.Module, vocab_size: int, batch_size: int,
                     device: torch.device) -> Precision:
    """``train.amp`` (true, false or ``"auto"``) made a decision for this run on ``device``. On a CPU:
    :func:`native_bf16_cpu` first; a CPU without native bf16 trains ``auto`` in float32 unmeasured, one with it
    (or of unknown flags) measures :func:`bf16_step_ratio`. ``true`` is obeyed, with a warning giving the
    measured ratio where bf16 is slower."""
    if setting is False:
        return Precision(False, "train.amp=false")
    if device.type != "cpu":
        return Precision(True, f"train.amp={str(setting).lower()} on {device.type}")
    native, evidence = native_bf16_cpu()
    if setting == "auto" and native is False:
        return Precision(False, f"train.amp=auto: {evidence}, where bf16 is emulated and many times slower")
    ratio = bf16_step_ratio(model, loss, vocab_size, batch_size, device)
    measured = f"a bf16 training step took {ratio:.2f}x the float32 time here ({evidence})"
    if setting is True:
        if ratio >= 1:
            log.warning("train.amp=true: %s; train.amp=auto (or false) would train in float32 here", measured)
        return Precision(True, f"train.amp=true; {measured}")
    return Precision(ratio < AUTO_BF16_BELOW, f"train.amp=auto: {measured}, "
                                              f"{'below' if ratio < AUTO_BF16_BELOW else 'not below'} "
                                              f"{AUTO_BF16_BELOW}")


def bf16_step_ratio(model: nn.Module, loss: nn.Module, vocab_size: int, batch_size: int,
                    device: torch.device) -> float:
    """(bf16 autocast step time) / (float32 step time): the median of the ratios of interleaved pairs of steps,
    so that a pair disturbed by another process counts little. A step is the forward and backward of
    ``model.decoder`` and ``loss`` on ``min(batch_size, PROBE_BATCH)`` random captions of :data:`PROBE_WORDS`
    words; on a CPU on one torch thread (steadier on a shared machine). At least :data:`PROBE_MIN_PAIRS` pairs.
    Weights, gradients, the loss's state, the random generators and the thread count are left as they were."""
    grid, dim = model.encoder.grid, model.encoder.feature_dim
    batch = min(batch_size, PROBE_BATCH)
    loss_state = copy.deepcopy(loss.state_dict())
    was_training, threads = model.training, torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    with torch.random.fork_rng(devices=[]):
        generator = torch.Generator().manual_seed(0)
        regions = torch.randn(batch, grid[0] * grid[1], dim, generator=generator).to(device)
        captions = torch.randint(4, max(vocab_size, 5), (batch, PROBE_WORDS + 2), generator=generator)
        captions[:, 0], captions[:, -1] = 1, 2          # <start> ... <end>
        captions = captions.to(device)
        model.train()

        def step(amp: bool) -> float:
            started = time.perf_counter()
            with autocast(device, amp):
                losses = loss(model.decoder(regions, captions), captions[:, 1:])
            losses["loss"].backward()
            model.zero_grad(set_to_none=True)
            return time.perf_counter() - started

        step(False), step(True)                         # warm-up: kernels chosen, memory allocated
        ratios = []
        started = time.perf_counter()
        for k in range(PROBE_PAIRS):
            if k >= PROBE_MIN_PAIRS and time.perf_counter() - started > PROBE_SECONDS:
                break
            times = {amp: step(amp) for amp in ((False, True) if k % 2 == 0 else (True, False))}
            ratios.append(times[True] / times[False])
    loss.load_state_dict(loss_state)
    model.train(was_training)
    torch.set_num_threads(threads)
    return statistics.median(ratios)
