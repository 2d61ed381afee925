"""Small helpers: device choice and description, usable cores, seeding, random-state capture, JSON reading, atomic file writes,
file digests."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import logging
import os
import platform
import random
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch
from tqdm import tqdm

from captioner.errors import CaptionerError

log = logging.getLogger(__name__)

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"    # the log lines of every command and demo worker


PROGRESS_LINE_S = 60.0
"""How often a progress bar that is not on a terminal writes a line (:func:`progress_bar`)."""


class ProgressLines(tqdm):
    """A tqdm bar for a stream that is not a terminal (a log file, CI, ``nohup``): instead of redrawing itself with a
    carriage return at every update, it writes its state as a line of its own at most every ``mininterval``
    seconds, and nothing when it closes."""

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        now = self._time()
        if msg is None and self.n != self.initial and now - getattr(self, "line_at", self.start_t) >= self.mininterval:
            self.line_at = now
            self.fp.write(self.__str__() + "\n")
            self.fp.flush()
        return False        # nothing drawn in place, so nothing to clear


def progress_bar(iterable=None, *, show: bool = True, file=None, **options) -> tqdm:
    """A tqdm progress bar over ``iterable`` (``options`` as tqdm's) on ``file`` (default: stderr) when ``show``.
    On a terminal it redraws itself in place; elsewhere (a log file, CI, ``nohup``) it writes no per-batch update,
    only a plain line every :data:`PROGRESS_LINE_S` seconds (or ``mininterval``; :class:`ProgressLines`)."""
    file = file or sys.stderr
    if not show or getattr(file, "isatty", lambda: False)():
        return tqdm(iterable, file=file, disable=not show, **options)
    options = {"mininterval": PROGRESS_LINE_S, **options, "leave": False,
               "bar_format": "{desc}: {n_fmt}/{total_fmt} {unit} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"}
    return ProgressLines(iterable, file=file, **options)


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
            return _first_line(err)
    if caught:
        return _first_line(caught[0].message)
    return "no CUDA device was found"


def _first_line(message: object) -> str:
    text = str(message).strip()
    return text.splitlines()[0] if text else type(message).__name__


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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """The random states that training consumes (dropout, sampling), in a form ``weights_only`` loads."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _read_umask()
"""The process's umask, read once at import: the permissions a file or folder made by ``open`` or ``mkdir`` gets
are ``0o666 & ~UMASK`` and ``0o777 & ~UMASK``; files written through a temporary file get the same."""


def atomic_write(path: str | Path, write) -> None:
    """Write ``path`` through ``write(file_object)`` into a temporary file, fsync it, then rename it over
    ``path``: a crash or a full disk never leaves a half-written file behind, and the old file stays. The file gets
    the permissions ``open`` would give it (the temporary file's own are owner-only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    if hasattr(os, "fchmod"):
        os.fchmod(fd, 0o666 & ~UMASK)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_file(path: str | Path, content: str | bytes | Callable[[BinaryIO], object]) -> Path:
    """Write an output file atomically (:func:`atomic_write`): ``content`` as UTF-8 text, bytes, or written by
    ``content(binary_file)``. A failed write (a full disk, a folder that cannot be written) is a
    :class:`~captioner.errors.CaptionerError` naming the file; the file as it was stays."""
    path = Path(path)
    if isinstance(content, str):
        content = content.encode("utf-8")
    write = (lambda handle: handle.write(content)) if isinstance(content, bytes) else content
    try:
        atomic_write(path, write)
    except (FileExistsError, NotADirectoryError):
        folder = next(parent for parent in path.parents if parent.exists())
        raise CaptionerError(f"{path}: cannot write: {folder} is a file, not a folder") from None
    except OSError as err:
        raise CaptionerError(f"{path}: cannot write ({err.strerror or err}); the file as it was is unchanged") from None
    return path


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, as hex digits."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: str | Path, object_hook: Callable[[dict], object] | None = None) -> object:
    """Parse a JSON file (each object through ``object_hook`` as it is decoded, when given); errors name the file
    and the line/column at fault."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            return json.load(handle, object_hook=object_hook)
    except FileNotFoundError:
        raise CaptionerError(f"{path}: file not found") from None
    except json.JSONDecodeError as err:
        raise CaptionerError(f"{path}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    except UnicodeDecodeError as err:
        raise CaptionerError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise CaptionerError(f"{path}: cannot read ({err.strerror})") from None


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4   # glibc mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse instead of handing it back to the system at every free.

    By default glibc serves allocations above a threshold (at most 32 MB) with fresh ``mmap`` calls and returns
    them with ``munmap``: a decoding step's large tensors (B * k hypotheses x L regions x A) then cost page
    faults at every step, and a fresh process decodes ~40 % slower than one that has warmed up. With mmap off
    and the heap never trimmed, freed blocks are reused. Called when a command starts; a no-op returning False
    where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**30))


def release_freed_memory() -> bool:
    """Hand the freed memory glibc keeps (:func:`keep_freed_memory`) back to the system once (``malloc_trim``):
    after a one-off peak such as parsing a large annotation file, whose buffers would otherwise stay resident
    in this process and in every process forked from it. A no-op returning False where the C library is not glibc."""
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim     # the C library this process runs on
    except (OSError, AttributeError):
        return False
    return bool(malloc_trim(0))


def backward_keeps_graph() -> bool:
    """Whether the backward pass running now keeps the graph (``retain_graph``), so that a custom autograd node
    must not overwrite the tensors it saved; True where torch cannot say (no such query, or while compiling:
    a traced backward runs again for every later pass)."""
    keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    if keep_graph is None or torch.compiler.is_compiling():
        return True
    return bool(keep_graph())
