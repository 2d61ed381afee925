"""Results that cannot go stale: every benchmark and study whose numbers a table in the docs shows writes them
here, as ``benchmarks/results/NAME.json``, through :func:`write_result`, and nowhere else.

A result records what it measured (``result``), the command that measured it, the machine it ran on
(:func:`machine_block`: CPU model and vector extensions, cores and threads, GPU, torch, date, commit) and the files
its numbers depend on (``inputs``: the recipe, the script, the code it measures), each with its SHA-256 as it was
when the numbers were taken. ``scripts/render_results.py`` renders each result into its table between
``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` (the table formats: ``benchmarks/tables.py``), and
``tests/test_results.py`` fails when a committed table differs from what its JSON renders or when one of its inputs
has changed since (:func:`stale_inputs`): the numbers are then those of other code, and the command must run again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
VECTOR_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_flags() -> list[str]:
    """The vector extensions of :data:`VECTOR_FLAGS` this CPU has (``/proc/cpuinfo``; empty where unreadable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                return [flag for flag in VECTOR_FLAGS if flag in present]
    except OSError:
        pass
    return []


def git(*arguments: str) -> str | None:
    """What ``git ARGUMENTS`` prints in the repository, stripped; None outside a git checkout."""
    try:
        done = subprocess.run(["git", *arguments], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def machine_block(date: float | None = None, commit: str | None = None) -> dict:
    """Where and when a result was measured: the CPU's model and vector extensions, the cores this process may use
    and torch's threads, the GPUs, the torch and Python versions, the date (UTC; ``date``: a Unix time instead of
    now), the commit checked out (``commit``: the one that ran, where another checkout did) and whether the checkout
    had uncommitted changes."""
    import torch

    from captioner.utils import cpu_model, usable_cores

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    status = None if commit else git("status", "--porcelain", "--untracked-files=no")
    return {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "cores": usable_cores(), "threads": torch.get_num_threads(),
            "gpu": gpus, "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(date)), "commit": commit or git("rev-parse", "HEAD"),
            "uncommitted_changes": bool(status) if status is not None else None,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def in_repository(path: str | Path) -> Path:
    """``path`` as an absolute path: as it is when absolute, else relative to the repository root."""
    path = Path(path)
    return (path if path.is_absolute() else ROOT / path).resolve()


def repository_path(path: str | Path) -> str:
    """``path`` relative to the repository root, as results name their inputs."""
    return in_repository(path).relative_to(ROOT).as_posix()


def write_result(name: str, payload: dict, inputs: Sequence[str | Path], command: str | None = None,
                 date: float | None = None, commit: str | None = None, results_dir: Path = RESULTS_DIR) -> Path:
    """Write ``payload`` as the result ``name`` (``results_dir/NAME.json``) with the machine block, the command
    (default: this process's, as ``python SCRIPT ARGS``) and the SHA-256 of each file of ``inputs`` (paths inside
    the repository, absolute or relative to its root: the recipe, the script and the code whose change would change
    the numbers); ``date`` and ``commit`` as :func:`machine_block` takes them; returns its path."""
    if command is None:
        command = shlex.join(["python", repository_path(Path(sys.argv[0]).resolve()), *sys.argv[1:]])
    files = {repository_path(path): digest(in_repository(path)) for path in inputs}
    record = {"name": name, "command": command, "machine": machine_block(date, commit),
              "inputs": dict(sorted(files.items())), "result": payload}
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.json"
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(record, indent=2) + "\n")
    temporary.replace(path)
    return path


def add_entry(name: str, section: str, key: str, entry: dict, inputs: Sequence[str | Path],
              results_dir: Path = RESULTS_DIR) -> Path:
    """Add ``entry``, with this machine's block, as ``key`` of the ``section`` mapping of the result ``name``, beside
    the entries measured before (each keeps its own machine block); returns the result's path. Entries measured
    with other versions of ``inputs`` are dropped, and stderr names them and the files that changed."""
    path = results_dir / f"{name}.json"
    saved = json.loads(path.read_text()) if path.exists() else None
    kept = dict(saved["result"][section]) if saved else {}
    if saved and stale_inputs(saved):
        print(f"{path}: dropping {', '.join(kept)}, measured with other versions of "
              f"{', '.join(stale_inputs(saved))}", file=sys.stderr)
        kept = {}
    kept[key] = {**entry, "machine": machine_block()}
    return write_result(name, {section: dict(sorted(kept.items()))}, inputs=inputs, results_dir=results_dir)


def report(name: str, payload: dict, inputs: Sequence[str | Path]) -> None:
    """What a benchmark script ends with: print ``payload`` as JSON (``run_all.py`` reads it) and write it as the
    result ``name`` (:func:`write_result`), saying where on stderr."""
    print(json.dumps(payload, indent=2))
    path = write_result(name, payload, inputs)
    print(f"wrote {repository_path(path)}", file=sys.stderr)


def load_results(results_dir: Path = RESULTS_DIR) -> dict[str, dict]:
    """Every result in ``results_dir`` by name."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(results_dir.glob("*.json"))}


def stale_inputs(record: dict, root: Path = ROOT) -> list[str]:
    """The inputs of ``record`` that are missing or differ from the files its numbers were measured with."""
    return [path for path, sha256 in record["inputs"].items()
            if not (root / path).is_file() or digest(root / path) != sha256]
