"""The device a run uses (``auto``, ``cpu``, ``cuda``, ``cuda:N``) with a reason where CUDA does not work, and
what a device is, in one line: the CPU's model, the GPU's name, the cores this process may use."""

from __future__ import annotations

import logging
import os
import platform
import warnings
from pathlib import Path

import torch

from captioner.errors import CaptionerError, first_line

log = logging.getLogger(__name__)


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` -> ``cuda`` when a GPU is usable, else ``cpu`` (with a warning naming why when an NVIDIA driver is
    installed but CUDA does not work); ``cpu``, ``cuda``, ``cuda:N`` as given, or one line naming why not."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if Path(NVIDIA_DRIVER_FILE).exists():
            log.warning("run.device=auto: this machine has an NVIDIA driver but CUDA does not work (%s); "
                        "running on the CPU", cuda_unavailable_reason())
        return torch.device("cpu")
    device = parse_device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CaptionerError(f"run.device={name}: CUDA does not work on this machine: {cuda_unavailable_reason()}")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise CaptionerError(f"run.device={name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def parse_device(name: str) -> torch.device:
    """The device ``cpu``, ``cuda`` or ``cuda:N`` names (not ``auto``), without asking whether it works here; one
    line naming ``run.device`` for any other name."""
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda") or (device.type == "cpu" and device.index is not None):
        raise CaptionerError(f"run.device: unknown device {name!r} (use auto, cpu, cuda or cuda:N)")
    return device


NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"    # present where the NVIDIA kernel driver is loaded (Linux)


def cuda_unavailable_reason() -> str:
    """Why PyTorch cannot use CUDA here, in one line: a build without CUDA, GPUs hidden by
    ``CUDA_VISIBLE_DEVICES``, or what CUDA's initialisation says (no driver, a driver too old for this build...)."""
    if torch.version.cuda is None:
        return f"this PyTorch build ({torch.__version__}) has no CUDA support"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.cuda.init()
        except Exception as err:     # torch raises RuntimeError or AssertionError with the driver's story
            return first_line(err)
    if caught:
        return first_line(caught[0].message)
    return "no CUDA device was found"


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo`` on Linux), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_driver_version() -> str | None:
    """The loaded NVIDIA kernel driver's version (Linux), or None where it cannot be read."""
    try:
        text = Path(NVIDIA_DRIVER_FILE).read_text()
    except OSError:
        return None
    words = text.split()
    return next((w for w in words if w.count(".") >= 1 and w.replace(".", "").isdigit()), None)


def describe_device(device: torch.device) -> str:
    """One line saying what ``device`` is: the GPU's name, memory, CUDA and driver versions, or the CPU's model,
    vector extensions and torch threads; with the torch version."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return (f"{device} = {props.name} ({props.total_memory / 2**30:.0f} GiB, compute capability "
                f"{props.major}.{props.minor}), CUDA {torch.version.cuda}, driver {nvidia_driver_version() or 'unknown'}, "
                f"torch {torch.__version__}")
    threads = torch.get_num_threads()
    return (f"cpu = {cpu_model()} ({torch.backends.cpu.get_cpu_capability()}, {threads} torch thread"
            f"{'s' if threads != 1 else ''}), torch {torch.__version__}")


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
