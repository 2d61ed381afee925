"""Results keyed by what made them: every benchmark and study whose numbers a table in the docs shows writes them
as ``benchmarks/results/NAME.json`` through :func:`write_result` (or :func:`add_entry`), and nowhere else.

A result records what it measured (``result``), the command, the machine (:func:`machine_block`) and what made
its numbers:

* ``settings``: for each config it ran (a recipe, or ``defaults``, with overrides), every resolved setting that
  shapes numbers (paths, output folders and log settings left out: :func:`result_settings`);
* ``fingerprint``: what each probe of the code it ran computed then (:mod:`captioner.results.fingerprint`).

:func:`why_stale` holds both against the code as it is: a setting whose value changed, and a probe whose numbers
changed, make the result stale, each named; moving code, a docstring or a recipe's comments and paths do not.
``scripts/render_results.py`` renders each result into its table and fails on a stale one. A result made of
entries (runs of a study, recipes timed, added one by one by :func:`add_entry`) records with each entry which of
its configs and probes made it, so that changing one recipe drops only the entries that recipe made.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from captioner.results.fingerprint import ConfigRef, compute, differences

ROOT = Path(__file__).resolve().parents[2]
"""The repository root, in a clone (results live beside the code there, never in an installed package)."""
RESULTS_DIR = ROOT / "benchmarks" / "results"
VECTOR_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
FLAT_LIST = re.compile(r"\[\s*([^\[\]{}\"]*(?:\"[^\"]*\"[^\[\]{}\"]*)*?)\s*\]")
"""A JSON list holding no list or object (strings in it may not hold brackets or braces, nor escaped quotes)."""
SHOWN_DIFFERENCES = 3
"""Differences named per probe when it changed."""


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
    """Where and when a result was measured: CPU model and vector extensions, usable cores and torch threads, GPUs,
    torch and Python versions, the date (UTC; ``date``: a Unix time instead of now), the commit (``commit``: the
    one that ran, where another checkout did), whether the checkout had uncommitted changes, the load average."""
    import torch

    from captioner.core.devices import cpu_model, usable_cores

    gpus = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available()
            else [])
    status = None if commit else git("status", "--porcelain", "--untracked-files=no")
    return {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "cores": usable_cores(), "threads": torch.get_num_threads(),
            "gpu": gpus, "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(date)),
            "commit": commit or git("rev-parse", "HEAD"),
            "uncommitted_changes": bool(status) if status is not None else None,
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def result_settings(config) -> dict[str, object]:
    """The settings of a resolved config that shape numbers, as flat ``{"section.key": value}`` (those declared
    with ``affects_results=False`` left out)."""
    from captioner.config import SECTIONS
    from captioner.core.settings import settings_of
    from captioner.models.captioner import DECODERS

    def section(prefix: str, kind, values) -> dict:
        return {f"{prefix}.{name}": _plain(getattr(values, name)) for name, field in settings_of(kind).items()
                if field.metadata.get("affects_results", True)}

    out = {"model.decoder": config.model.decoder}
    for name, kind in SECTIONS.items():
        out |= section(name, kind, getattr(config, name))
    for name, entry in DECODERS.items():
        out |= section(f"model.{name}", entry.config, config.model.sections[name])
    return dict(sorted(out.items()))


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def setting_defaults() -> dict[str, object]:
    """:func:`result_settings` of a config of defaults."""
    from captioner.config import Config

    return result_settings(Config())


def made_by(configs: Sequence[ConfigRef | str], probes: Sequence[str]) -> dict:
    """The ``settings`` and ``fingerprint`` blocks of a result made with ``configs`` whose numbers depend on the
    code that ``probes`` exercise."""
    refs = [ConfigRef.parse(c) if isinstance(c, str) else c for c in configs]
    return {"settings": {ref.key: result_settings(ref.load()) for ref in refs},
            "fingerprint": {name: compute(name) for name in probes}}


def write_result(name: str, payload: dict, *, configs: Sequence[ConfigRef | str], probes: Sequence[str],
                 command: str | None = None, date: float | None = None, commit: str | None = None,
                 results_dir: Path = RESULTS_DIR) -> Path:
    """Write ``payload`` as the result ``name`` (``results_dir/NAME.json``) with the machine block, the command
    (default: this process's, as ``python SCRIPT ARGS``) and what made it (:func:`made_by`); ``date`` and
    ``commit`` as :func:`machine_block` takes them. Returns its path."""
    if command is None:
        script = Path(sys.argv[0]).resolve()
        shown = script.relative_to(ROOT).as_posix() if script.is_relative_to(ROOT) else script.name
        command = shlex.join(["python", shown, *sys.argv[1:]])
    record = {"name": name, "command": command, "machine": machine_block(date, commit), **made_by(configs, probes),
              "result": payload}
    return save(record, results_dir)


def save(record: dict, results_dir: Path = RESULTS_DIR) -> Path:
    """Write a whole result record atomically; returns its path."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{record['name']}.json"
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(dumps(record) + "\n")
    temporary.replace(path)
    return path


def dumps(record: dict) -> str:
    """``record`` as indented JSON with each list of plain values on one line (a probe's numbers, a row of scores)."""
    return FLAT_LIST.sub(lambda m: "[" + " ".join(m[1].split()) + "]", json.dumps(record, indent=1))


def add_entry(name: str, section: str, key: str, entry: dict, *, configs: Sequence[ConfigRef | str],
              probes: Sequence[str], keep_stale: bool = False, results_dir: Path = RESULTS_DIR) -> Path:
    """Add ``entry``, with this machine's block and what made it (``made_by``: the keys of ``configs`` and the
    ``probes``), as ``key`` of the ``section`` mapping of the result ``name``, beside the entries measured before
    (each keeps its own machine block and ``made_by``; one saved without it was made by all its result's configs
    and probes); returns the result's path. The result's ``settings`` and ``fingerprint`` cover what made its
    entries. An entry made with other settings or another behaviour of the code than now cannot sit beside it: it is
    dropped, and stderr says why, or with ``keep_stale`` nothing is written and a
    :class:`~captioner.errors.CaptionerError` says why; a change to a config or probe that made no kept entry drops
    nothing, and an entry ``key`` made otherwise is replaced either way."""
    from captioner.errors import CaptionerError

    path = results_dir / f"{name}.json"
    saved = json.loads(path.read_text()) if path.exists() else None
    kept = entries_with_makers(saved, section) if saved else {}
    dropped = {k: reasons for k, reasons in (made_otherwise(saved, section) if saved else {}).items()
               if k != key}                                                           # ``key`` is replaced
    if dropped and keep_stale:
        raise CaptionerError(made_otherwise_message(path, dropped))
    for k, reasons in dropped.items():
        print(f"{path}: dropping {k}: {'; '.join(reasons)}", file=sys.stderr)
        del kept[k]
    refs = [ConfigRef.parse(c) if isinstance(c, str) else c for c in configs]
    kept[key] = {**entry, "made_by": {"configs": [ref.key for ref in refs], "probes": list(probes)},
                 "machine": machine_block()}
    used = [e["made_by"] for e in kept.values()]
    return write_result(name, {section: dict(sorted(kept.items()))},
                        configs=list(dict.fromkeys(c for made in used for c in made["configs"])),
                        probes=list(dict.fromkeys(p for made in used for p in made["probes"])),
                        results_dir=results_dir)


def entries_with_makers(record: dict, section: str) -> dict[str, dict]:
    """The entries of ``record``'s ``section`` mapping, each with its ``made_by`` (one saved without it was made by
    all the result's configs and probes)."""
    everything = {"configs": list(record["settings"]), "probes": list(record["fingerprint"])}
    return {k: {**e, "made_by": e.get("made_by") or everything} for k, e in record["result"][section].items()}


def made_otherwise(record: dict, section: str) -> dict[str, list[str]]:
    """The entries of ``record``'s ``section`` mapping made with other settings or another behaviour of the code
    than now, each with why."""
    stale = stale_parts(record)
    found = {k: [reason for part in (*e["made_by"]["configs"], *e["made_by"]["probes"])
                 for reason in stale.get(part, [])] for k, e in entries_with_makers(record, section).items()}
    return {k: reasons for k, reasons in found.items() if reasons}


def entries_made_otherwise(name: str, section: str, results_dir: Path = RESULTS_DIR) -> dict[str, list[str]]:
    """:func:`made_otherwise` of the result ``name``; empty where there is no such result."""
    path = results_dir / f"{name}.json"
    return made_otherwise(json.loads(path.read_text()), section) if path.exists() else {}


def made_otherwise_message(path: Path, found: dict[str, list[str]]) -> str:
    """One line naming the entries of ``path`` made otherwise (:func:`entries_made_otherwise`) and why."""
    reasons = dict.fromkeys(reason for listed in found.values() for reason in listed)
    return f"{path}: {', '.join(found)} were made otherwise: {'; '.join(reasons)}"


def report(name: str, payload: dict, *, configs: Sequence[ConfigRef | str], probes: Sequence[str]) -> None:
    """What a benchmark script ends with: print ``payload`` as JSON (``run_all.py`` reads it) and write it as the
    result ``name`` (:func:`write_result`), saying where on stderr."""
    print(json.dumps(payload, indent=2))
    path = write_result(name, payload, configs=configs, probes=probes)
    print(f"wrote {path}", file=sys.stderr)


def load_results(results_dir: Path = RESULTS_DIR) -> dict[str, dict]:
    """Every result in ``results_dir`` by name."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(results_dir.glob("*.json"))}


def settings_changes(key: str, recorded: dict) -> list[str]:
    """How the settings of config ``key`` differ now from ``recorded``: a setting changed or gone, or a new one away
    from its default (a new setting at its default reproduces what was there before it)."""
    from captioner.errors import CaptionerError

    try:
        now = result_settings(ConfigRef.parse(key).load())
    except (CaptionerError, KeyError) as err:   # a recipe removed, an override no longer valid
        return [f"{key}: cannot be loaded now ({err})"]
    defaults = setting_defaults()
    changes = []
    for name, value in recorded.items():
        if name not in now:
            changes.append(f"{name} no longer exists")
        elif now[name] != value:
            changes.append(f"{name} {value!r} -> {now[name]!r}")
    changes += [f"{name} is new and {now[name]!r}, not its default {defaults.get(name)!r}" for name in now
                if name not in recorded and now[name] != defaults.get(name)]
    return [f"config '{key}': {change}" for change in changes]


def changed_settings(record: dict) -> dict[str, list[str]]:
    """Each config (by key) of ``record`` whose settings differ now from those recorded, with how."""
    return {key: changes for key, recorded in record["settings"].items()
            if (changes := settings_changes(key, recorded))}


def stale_parts(record: dict) -> dict[str, list[str]]:
    """What made ``record`` that the code and settings no longer make: each config (by key) whose settings changed
    and each probe (by name) that computes other numbers, with why (the first differences)."""
    parts = changed_settings(record)
    for name, recorded in record["fingerprint"].items():
        try:
            found = differences(recorded, compute(name))
        except Exception as err:
            found = [f"cannot be computed now ({type(err).__name__}: {err})"]
        if found:
            more = f" (and {len(found) - SHOWN_DIFFERENCES} more)" if len(found) > SHOWN_DIFFERENCES else ""
            parts[name] = [f"probe '{name}' computes other numbers: {'; '.join(found[:SHOWN_DIFFERENCES])}{more}"]
    return parts


def why_stale(record: dict) -> list[str]:
    """Why ``record``'s numbers are not those the code and settings make now (empty: they are): each config whose
    settings changed and each probe that computes other numbers, with the first differences."""
    return [reason for reasons in stale_parts(record).values() for reason in reasons]


def reprobe(record: dict) -> list[str]:
    """Set ``record``'s fingerprint to what its probes compute now; returns the probes whose numbers moved. For a
    probe that itself changed (``scripts/reprobe_results.py``), never for code that changed: that makes a result
    stale. A record whose settings no longer resolve as recorded is left as it is (CaptionerError naming them)."""
    from captioner.errors import CaptionerError

    changes = [change for found in changed_settings(record).values() for change in found]
    if changes:
        raise CaptionerError(f"{record['name']}: its settings changed, so no probe stands for it: "
                             f"{'; '.join(changes[:SHOWN_DIFFERENCES])}")
    now = {name: compute(name) for name in record["fingerprint"]}
    moved = [name for name, value in now.items() if differences(record["fingerprint"][name], value)]
    record["fingerprint"] = now
    return moved


def pinned_key(key: str, recorded: dict) -> str | None:
    """Config ``key`` with overrides appended that give back the settings ``recorded`` where its recipe has changed
    since (each changed setting set to its recorded value, a setting new since then to its default): ``key`` itself
    where nothing changed, None where no overrides can (a setting gone, a recipe removed)."""
    from captioner.errors import CaptionerError

    ref = ConfigRef.parse(key)
    try:
        now = result_settings(ref.load())
    except (CaptionerError, KeyError):
        return None
    if set(recorded) - set(now):
        return None
    defaults = setting_defaults()
    wanted = {name: recorded[name] if name in recorded else defaults.get(name) for name in now}
    changed = [override_text(name, value) for name, value in sorted(wanted.items()) if now[name] != value]
    if not changed:
        return key
    pinned = ConfigRef(ref.recipe, (*ref.overrides, *changed), ref.init_from)
    return pinned.key if not settings_changes(pinned.key, recorded) else None


def override_text(name: str, value) -> str:
    """The override ``name=value`` as a config reads it back (a string bare where YAML keeps it a string)."""
    from captioner.config import parse_override

    text = f"{name}={value}" if isinstance(value, str) else f"{name}={json.dumps(value)}"
    nested = parse_override(text)
    for part in name.split("."):
        nested = nested[part]
    return text if nested == value else f"{name}={json.dumps(value)}"


def pin(record: dict, recipe: str) -> dict[str, str]:
    """Pin, in ``record``, each config of ``recipe`` whose settings changed since (:func:`pinned_key`): its key, the
    ``made_by`` of its entries, and the ``train`` and ``decode`` probes of that config (those that run it whole),
    renamed to the pinned key (a probe's recorded numbers are kept: :func:`why_stale` still holds them against the
    code); an entry's ``overrides`` (those its table shows) gain the pinned ones. Returns the keys renamed, old to
    new; a config that cannot be pinned is left as it is (stale)."""
    renamed = {key: new for key, recorded in record["settings"].items()
               if ConfigRef.parse(key).recipe == recipe and (new := pinned_key(key, recorded)) not in (None, key)}
    added = {old: ConfigRef.parse(new).overrides[len(ConfigRef.parse(old).overrides):] for old, new in renamed.items()}
    probes = {f"{kind} {old}": f"{kind} {new}" for old, new in renamed.items() for kind in ("train", "decode")}
    record["settings"] = {renamed.get(key, key): value for key, value in record["settings"].items()}
    record["fingerprint"] = {probes.get(name, name): value for name, value in record["fingerprint"].items()}
    for section in record["result"].values():
        entries = section.values() if isinstance(section, dict) else ()
        for entry in entries:
            if isinstance(entry, dict) and isinstance(entry.get("made_by"), dict):
                made = entry["made_by"]
                if isinstance(entry.get("overrides"), list):
                    entry["overrides"] += [override for key in made["configs"] for override in added.get(key, ())]
                made["configs"] = [renamed.get(key, key) for key in made["configs"]]
                made["probes"] = [probes.get(name, name) for name in made["probes"]]
    return renamed
