"""The main job (``make demo``): shapes data -> cached features -> train each demo run -> test scores ->
figures -> comparison report. ``captioner demo --runs soft_scst`` retrains only the runs named and keeps the
other rows of an earlier summary in the same folder; ``--resume`` continues every run from its ``last.pt``
(after Ctrl-C: the result of an uninterrupted demo).

Runs ``configs/demo_{name}.yaml`` for each name in ``DEMO_RUNS`` with the same seed and budget,
evaluates each on the held-out test split (beam: the configs' decode.beam), captions a few test images with attention
figures, compares the runs (``captioner compare``) and writes ``{out}/summary.json``.

On a CPU the runs train side by side, one worker process per usable core (``jobs``), each with its share of the
cores as torch threads: the demo's small LSTM steps use a second thread poorly, so two one-thread runs together
finish in 0.57-0.73 of the time the two take one after the other with two threads each (README, Speed). With a
GPU (or ``jobs=1``) they train one after the other in this process.
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

from captioner.checkpoint import load_model
from captioner.config import load_config
from captioner.data.feature_cache import cache_features
from captioner.data.readers import read_split
from captioner.data.shapes import FORMAT_VERSION, generate_shapes
from captioner.decoding.search import DecodeConfig
from captioner.errors import CaptionerError
from captioner.evaluation.evaluate import evaluate_checkpoint
from captioner.inference import attend_file
from captioner.training.engine import train
from captioner.utils import LOG_FORMAT, keep_freed_memory, usable_cores, write_file
from captioner.visualisation.report import write_report

DEMO_RUNS = ("soft", "none", "hard", "transformer", "soft_scst")
STARTS_FROM = {"soft_scst": "soft"}   # runs that fine-tune another run's best checkpoint
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
FIGURE_IMAGES = 4
SUMMARY_KEYS = ("BLEU-4", "CIDEr", "METEOR", "object_precision", "relation_accuracy", "pointing_accuracy")


def shapes_overrides(data_dir: Path, features: Path) -> list[str]:
    """Config overrides that point the ``data`` section at shapes data in ``data_dir`` (all three splits,
    captions and instances) and at the feature cache folder ``features``."""
    splits = ("train", "val", "test")
    captions = {s: str(data_dir / "annotations" / f"captions_{s}.json") for s in splits}
    instances = {s: str(data_dir / "annotations" / f"instances_{s}.json") for s in splits}
    images = {s: str(data_dir / "images") for s in splits}
    return [f"data.captions={json.dumps(captions)}", f"data.instances={json.dumps(instances)}",
            f"data.images={json.dumps(images)}", f"data.features={features}"]


# A smoke-sized run: the same pipeline end to end in seconds (used by the tests, `captioner demo --fast`).
FAST_OVERRIDES = ["train.epochs=1", "model.lstm.hidden_dim=32", "model.lstm.attention_dim=16", "model.lstm.embed_dim=16",
                  "train.val_max_images=16", "encoder.pretrained=false"]


def ensure_shapes(data_dir: Path, num_images: int, seed: int = 0) -> dict:
    """Generate the shapes data unless ``data_dir`` already holds the same (seed, size, format) set;
    returns the data's ``info`` block."""
    marker = data_dir / "annotations" / "captions_test.json"
    if marker.exists():
        info = json.loads(marker.read_text()).get("info", {})
        if (info.get("seed"), info.get("num_images"), info.get("version")) == (seed, num_images, FORMAT_VERSION):
            print(f"shapes data: reusing {data_dir}")
            return info
    started = time.perf_counter()
    generate_shapes(data_dir, seed=seed, num_images=num_images)
    print(f"shapes data: {num_images} images in {time.perf_counter() - started:.1f} s -> {data_dir}")
    return json.loads(marker.read_text())["info"]


def reset_stale_features(features: Path, data_info: dict) -> None:
    """Empty the feature cache when it was made from other shapes data (another seed, size or format),
    so the resumable cache never mixes old features with new images."""
    stamp = features / "shapes_info.json"
    if stamp.exists() and json.loads(stamp.read_text()) == data_info:
        return
    if features.exists():
        shutil.rmtree(features)
    features.mkdir(parents=True)
    stamp.write_text(json.dumps(data_info, sort_keys=True))


def cache_demo_features(config: dict) -> float:
    """Cache the frozen encoder's features for every split; returns the seconds spent."""
    started = time.perf_counter()
    result = cache_features(config, ("train", "val", "test"), batch_size=64)
    if result["failed"]:
        raise CaptionerError(f"{config['data']['features']}: {len(result['failed'])} demo image(s) unreadable")
    return time.perf_counter() - started


def demo_figures(checkpoint: Path, out_dir: Path, count: int) -> list[str]:
    """Caption the first ``count`` test images of the checkpoint's data and draw their attention figures (as
    ``captioner attend``)."""
    model, vocab, config, _ = load_model(checkpoint)
    paths = []
    for record in read_split(config["data"], "test")[:count]:
        path = out_dir / f"attention_{record.image_id}.png"
        result = attend_file(model, vocab, record.path, path, DecodeConfig.of(config),
                             max_pixels=config["data"]["max_pixels"])
        print(f"  {record.path.name}: {result.caption}")
        paths.append(str(path))
    return paths


def default_jobs(runs: int) -> int:
    """How many runs train at once by default: one with a GPU, else one per usable core (at most ``runs``)."""
    return 1 if torch.cuda.is_available() else max(1, min(runs, usable_cores()))


def threads_per_job(jobs: int) -> int:
    """Torch threads of each of ``jobs`` worker processes: an equal share of the usable cores, at least one."""
    return max(1, usable_cores() // jobs)


def run_demo(out: Path, data_dir: Path, fast: bool = False, runs: tuple[str, ...] = DEMO_RUNS,
             seed: int | None = None, jobs: int | None = None, resume: bool = False) -> dict:
    """The whole main job; returns (and writes) the summary. ``seed``: every run's ``run.seed`` instead of the
    configs' (the shapes data stay those of seed 0). ``jobs``: how many runs train at once, each in a worker
    process (default :func:`default_jobs`); 1 trains them one after the other in this process. ``resume``: a
    run whose folder holds a ``last.pt`` continues from it instead of starting over."""
    started = time.perf_counter()
    unknown = sorted(set(runs) - set(DEMO_RUNS))
    if unknown:
        raise CaptionerError(f"demo: no run named {', '.join(unknown)} (the runs: {', '.join(DEMO_RUNS)})")
    runs = tuple(name for name in DEMO_RUNS if name in runs)    # the order in which runs build on each other
    for name, base in STARTS_FROM.items():
        start = out / base / "best.pt"
        if name in runs and base not in runs and not start.exists():
            raise CaptionerError(f"{start}: demo run '{name}' starts from run '{base}', which is "
                                 f"neither among --runs nor trained before")
    out.mkdir(parents=True, exist_ok=True)
    data_info = ensure_shapes(data_dir, num_images=150 if fast else 3000)
    reset_stale_features(out / "features", data_info)
    common = (shapes_overrides(data_dir, out / "features") + (FAST_OVERRIDES if fast else [])
              + ([] if seed is None else [f"run.seed={seed}"]))
    configs = {name: load_config(CONFIG_DIR / f"demo_{name}.yaml", common + [f"run.out={out / name}"] + (
        [f"train.init_from={out / STARTS_FROM[name] / 'best.pt'}"] if name in STARTS_FROM else [])) for name in runs}
    # Every run reads the features of the first run's encoder (the runs that fine-tune another keep its encoder).
    feature_seconds = cache_demo_features(load_config(CONFIG_DIR / f"demo_{DEMO_RUNS[0]}.yaml", common))
    print(f"features cached in {feature_seconds:.1f} s")
    summary: dict = {"runs": earlier_runs(out, keep=set(DEMO_RUNS) - set(runs)), "figures": [],
                     "feature_seconds": round(feature_seconds, 1)}
    jobs = min(jobs or default_jobs(len(configs)), len(configs))
    if jobs == 1:
        for name, config in configs.items():
            summary["runs"][name] = finished(name, train_and_score(name, config, out, resume=resume), started)
    else:
        summary["runs"].update(train_side_by_side(configs, out, jobs, started, resume=resume))
    summary["runs"] = {name: summary["runs"][name] for name in DEMO_RUNS if name in summary["runs"]}
    shown = next(iter(summary["runs"]))          # soft, unless an earlier demo in out did not train it
    print(f"\n== captions and attention figures ({shown}) ==")
    summary["figures"] = demo_figures(Path(summary["runs"][shown]["checkpoint"]), out / "figures", FIGURE_IMAGES)
    print("\n== comparison report ==")
    report = write_report([out / name for name in summary["runs"]], out / "report", stats_images=100)
    summary["report"] = report["html"]
    summary["total_seconds"] = round(time.perf_counter() - started, 1)
    write_file(out / "summary.json", json.dumps(summary, indent=2))
    print_summary(summary)
    print(f"\nwrote {out / 'summary.json'}")
    return summary


def earlier_runs(out: Path, keep: set[str]) -> dict:
    """The summary rows of runs in ``keep`` that an earlier demo in ``out`` trained (their checkpoints still
    there), so that a demo of a few ``runs`` keeps the others in its summary and report."""
    path = out / "summary.json"
    rows = json.loads(path.read_text())["runs"] if path.exists() else {}
    return {name: row for name, row in rows.items() if name in keep and Path(row["checkpoint"]).exists()}


def train_and_score(name: str, config: dict, out: Path, progress: bool = True, resume: bool = False) -> dict:
    """Train one demo run (with ``resume``, on from its ``last.pt`` if it has one), score it on the test split;
    its row of the summary. Raises KeyboardInterrupt when a signal stopped the training (its resumable
    ``last.pt`` saved)."""
    model, objective = config["model"], config["train"]["objective"]
    kind = ("Transformer decoder" if model["decoder"] == "transformer"
            else f"LSTM, {model['lstm']['attention']} {model['lstm']['attention_mode']} attention")
    if objective == "scst":
        kind = f"self-critical fine-tuning of {Path(config['train']['init_from']).parent.name}"
    continuing = resume and (Path(config["run"]["out"]) / "last.pt").exists()
    print(f"\n== training '{name}' ({kind}){', on from its last.pt' if continuing else ''} ==")
    result = train(config, resume=continuing, overwrite=not continuing, progress=progress)
    if result["stopped"]:
        raise KeyboardInterrupt
    scores = evaluate_checkpoint(result["checkpoint"], "test", out_dir=out / name, progress=False)
    return {**{k: scores.get(k) for k in SUMMARY_KEYS}, "ROUGE-L": scores.get("ROUGE-L"), "BLEU-1": scores.get("BLEU-1"),
            "train_seconds": round(result["train_seconds"], 1), "words_per_s": round(result["words_per_s"] or 0),
            "epochs": result["epochs"], "checkpoint": result["checkpoint"]}


def finished(name: str, row: dict, started: float) -> dict:
    """``row`` with the seconds since the demo started; says so."""
    elapsed = time.perf_counter() - started
    print(f"'{name}' trained and scored {elapsed / 60:.1f} min after the start (data and features included): "
          f"test BLEU-4 {row['BLEU-4']:.3f}, CIDEr {row['CIDEr']:.3f}", flush=True)
    return {**row, "done_after_seconds": round(elapsed, 1)}


def train_side_by_side(configs: dict[str, dict], out: Path, jobs: int, started: float,
                       resume: bool = False) -> dict[str, dict]:
    """:func:`train_and_score` (with ``resume``) every run of ``configs``, ``jobs`` at a time, each in a worker
    process of its own with :func:`threads_per_job` torch threads; a run that starts from another
    (``STARTS_FROM``) waits for it, the others start in ``DEMO_RUNS`` order. Returns the rows in the order the
    runs finished.

    The workers live in a process group of their own: Ctrl-C (or SIGTERM) reaches this process alone, which then
    sends SIGTERM to the workers still running, so that a run in training saves a resumable ``last.pt`` and
    stops; the same happens to the others when one run fails, and its error is raised here."""
    threads = threads_per_job(jobs)
    print(f"\n== training {len(configs)} runs, {jobs} at a time ({threads} torch thread(s) each) ==", flush=True)
    context = multiprocessing.get_context("spawn")
    rows: dict[str, dict] = {}
    waiting, running = dict(configs), {}      # running: the receiving end of a worker's pipe -> (name, process)
    with sigterm_as_keyboard_interrupt():
        try:
            while waiting or running:
                busy = {name for name, _ in running.values()}
                ready = [name for name in waiting if STARTS_FROM.get(name) not in {*waiting, *busy}]
                for name in ready[:jobs - len(running)]:
                    receiver, sender = context.Pipe(duplex=False)
                    process = context.Process(target=train_in_worker, name=f"demo-{name}",
                                              args=(name, waiting.pop(name), out, resume, threads, sender))
                    process.start()
                    sender.close()
                    running[receiver] = (name, process)
                for receiver in multiprocessing.connection.wait(list(running)):
                    name, process = running.pop(receiver)
                    try:
                        outcome = receiver.recv()
                    except EOFError:                # it died without a word
                        outcome = ("ended", None)
                    process.join()
                    if outcome[0] == "row":
                        rows[name] = finished(name, outcome[1], started)
                    elif outcome[0] == "error":
                        raise outcome[1]
                    elif outcome[0] == "interrupted":
                        raise KeyboardInterrupt
                    else:
                        raise CaptionerError(f"{out / name}: the worker process of demo run '{name}' ended abruptly "
                                             f"(exit code {process.exitcode}: killed, or out of memory?)")
        except BaseException:
            for _, process in running.values():
                process.terminate()     # SIGTERM: see train_in_worker
            for _, process in running.values():
                process.join()
            raise
    return rows


def train_in_worker(name: str, config: dict, out: Path, resume: bool, threads: int, sender) -> None:
    """A worker process of :func:`train_side_by_side`: :func:`train_and_score` with ``threads`` torch threads,
    no progress bars and each printed line prefixed by ``[name]``; sends ``("row", row)``, ``("error", error)``
    or ``("interrupted", None)`` through ``sender``.

    SIGTERM stops it: in training, after saving a resumable ``last.pt``; in evaluation, at once."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()                # out of the terminal's process group: Ctrl-C goes to the demo process only
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    torch.set_num_threads(threads)
    keep_freed_memory()
    sys.stdout, sys.stderr = LinePrefixer(sys.stdout, f"[{name}] "), LinePrefixer(sys.stderr, f"[{name}] ")
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    try:
        sender.send(("row", train_and_score(name, config, out, progress=False, resume=resume)))
    except KeyboardInterrupt:
        sender.send(("interrupted", None))
    except Exception as err:                # handed to the demo process, which raises it
        if not isinstance(err, CaptionerError):
            traceback.print_exc()
        try:
            sender.send(("error", err))
        except Exception:                   # an error that does not pickle: its text
            sender.send(("error", RuntimeError(f"demo run '{name}': {type(err).__name__}: {err}")))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_keyboard_interrupt():
    """Within: SIGTERM to this process raises KeyboardInterrupt, as Ctrl-C does (in the main thread only)."""
    try:
        previous = signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    except ValueError:   # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class LinePrefixer(io.TextIOBase):
    """A text stream that writes each complete line to ``stream`` with ``prefix`` in front (blank lines left out),
    so that the output of workers printing at the same time stays readable."""

    def __init__(self, stream, prefix: str):
        self.stream, self.prefix, self.pending = stream, prefix, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        if lines:
            self.stream.write("".join(f"{self.prefix}{line}\n" for line in lines if line))
            self.stream.flush()
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.stream.write(f"{self.prefix}{self.pending}\n")
            self.pending = ""
        self.stream.flush()


def print_summary(summary: dict) -> None:
    columns = ("BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr", "object_precision", "relation_accuracy",
               "pointing_accuracy", "train_seconds")
    print("\n" + "run".ljust(12) + "".join(c.rjust(18) for c in columns))
    for name, row in summary["runs"].items():
        cells = "".join(("-" if row.get(c) is None else f"{row[c]:.3f}" if c != "train_seconds" else f"{row[c]:.0f}").rjust(18)
                        for c in columns)
        print(name.ljust(12) + cells)
    print(f"total {summary['total_seconds']:.0f} s (features {summary['feature_seconds']:.0f} s)")
