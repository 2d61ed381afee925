"""The main job (``make demo``): shapes data -> cached features -> train each demo run -> test scores ->
figures -> comparison report. ``captioner demo --runs soft_scst`` retrains only the runs named, keeping the
other rows of an earlier summary; ``--resume`` continues every run from its ``last.pt``.

Each name in ``DEMO_RUNS`` is the packaged recipe ``demo_{name}``, trained with the same seed and budget and
evaluated on the test split; the demo also draws attention figures, compares the runs and writes
``{out}/summary.json``.

On a CPU the runs train in worker processes, one per usable core (``processes``): soft first, data parallel on
all of them (so that its figures are ready first), then the others side by side. This process scores each run
as its training ends, with one METEOR Java process for all. With a GPU (or ``processes=1``) the runs train one
after the other here.
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
import socket
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path

import torch

from captioner.checkpoint import checkpoint_digest
from captioner.config import Config, load_config, recipes
from captioner.core.console import LOG_FORMAT
from captioner.core.devices import usable_cores
from captioner.core.files import write_file
from captioner.core.process import set_up_process
from captioner.data.readers import read_split
from captioner.data.shapes import FORMAT_VERSION, generate_shapes, shapes_info
from captioner.errors import CaptionerError
from captioner.evaluation.caption_metrics import meteor_kept
from captioner.models.captioner import DECODERS
from captioner.predictor import Predictor
from captioner.training.engine import train
from captioner.training.features import cache_features
from captioner.workflows.evaluate import evaluate_checkpoint
from captioner.workflows.report import write_report

DEMO_RUNS = ("soft", "none", "hard", "transformer", "soft_scst")
STARTS_FROM = {"soft_scst": "soft"}   # runs that fine-tune another run's best checkpoint
FIGURE_IMAGES = 4
REPORT_IMAGES, FAST_REPORT_IMAGES = 3, 1       # test images every run captions in the report (with --fast)
SUMMARY_KEYS = ("BLEU-4", "CIDEr", "METEOR", "object_precision", "relation_accuracy", "pointing_accuracy")
DATA_STAMP = "made_by_captioner_demo.txt"   # in a data folder the demo generated: it may generate it anew
DEMO_IMAGES, FAST_DEMO_IMAGES = 3000, 150
DEMO_DATA_SETS = {(0, DEMO_IMAGES), (0, FAST_DEMO_IMAGES)}   # (seed, images) of the demo's data sets
MAX_PROCESSES = 4       # data-parallel processes per run: beyond, a rank's share of a batch of 64 gets too small


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
    returns the data's ``info`` block. Generates only into a folder that is missing, empty, stamped as the
    demo's (:data:`DATA_STAMP`) or holding one of the demo's own sets (:data:`DEMO_DATA_SETS`, as versions
    before the stamp left them), where it replaces the files named as the generator's output; any other
    folder is a :class:`CaptionerError` before anything is written."""
    marker = data_dir / "annotations" / "captions_test.json"
    info = shapes_info(marker) or {}
    if (info.get("seed"), info.get("num_images"), info.get("version")) == (seed, num_images, FORMAT_VERSION):
        print(f"shapes data: reusing {data_dir}")
        return info
    ours = (data_dir / DATA_STAMP).is_file() or (info.get("seed"), info.get("num_images")) in DEMO_DATA_SETS
    if data_dir.is_dir() and any(data_dir.iterdir()) and not ours:
        raise CaptionerError(f"{data_dir}: holds files that are not the demo's shapes data; choose an empty or new "
                             f"folder (--data)")
    write_file(data_dir / DATA_STAMP, "shapes data generated by `captioner demo`, which may delete and generate "
                                      "it anew here\n")
    started = time.perf_counter()
    generate_shapes(data_dir, seed=seed, num_images=num_images, replace=True)
    print(f"shapes data: {num_images} images in {time.perf_counter() - started:.1f} s -> {data_dir}")
    return shapes_info(marker)


def reset_stale_features(features: Path, data_info: dict) -> None:
    """Empty the feature cache when it was made from other shapes data (another seed, size or format),
    so the resumable cache never mixes old features with new images. A non-empty ``features`` folder
    without the demo's stamp is a :class:`CaptionerError`: the demo deletes only caches it made."""
    stamp = features / "shapes_info.json"
    if stamp.exists() and json.loads(stamp.read_text()) == data_info:
        return
    if features.is_dir() and any(features.iterdir()) and not stamp.exists():
        raise CaptionerError(f"{features}: holds files that are not the demo's feature cache; choose an empty or "
                             f"new folder (--out)")
    if features.exists():
        shutil.rmtree(features)
    features.mkdir(parents=True)
    write_file(stamp, json.dumps(data_info, sort_keys=True))


def cache_demo_features(config: Config) -> float:
    """Cache the frozen encoder's features for every split; returns the seconds spent."""
    started = time.perf_counter()
    result = cache_features(config, ("train", "val", "test"), batch_size=64)
    if result["failed"]:
        raise CaptionerError(f"{config.data.features}: {len(result['failed'])} demo image(s) unreadable")
    return time.perf_counter() - started


def demo_figures(checkpoint: Path, out_dir: Path, count: int) -> list[str]:
    """Caption the first ``count`` test images of the checkpoint's data and draw their attention figures (as
    ``captioner attend``)."""
    predictor = Predictor.load(checkpoint)
    paths = []
    for record in read_split(predictor.config.data, "test")[:count]:
        path = out_dir / f"attention_{record.image_id}.png"
        result = predictor.attend(record.path, path)
        print(f"  {record.path.name}: {result.caption}")
        paths.append(str(path))
    return paths


def figures_of(name: str, checkpoint: Path, out: Path, started: float, training: Sequence[str]) -> list[str]:
    """:func:`demo_figures` of run ``name``'s ``checkpoint`` into ``out/figures``; says how long after the demo's
    start its model and figures were ready, how to use them, and which runs are still ``training``."""
    print(f"\n== captions and attention figures ({name}) ==", flush=True)
    figures = demo_figures(checkpoint, out / "figures", FIGURE_IMAGES)
    still = f"runs still to finish: {', '.join(training)}; meanwhile, try " if training else "try "
    print(f"'{name}' model and its attention figures ready {time.perf_counter() - started:.0f} s after the start: "
          f"{checkpoint}, {Path(figures[0]).parent}/ ({still}"
          f"`captioner caption IMAGE --checkpoint {checkpoint}`)", flush=True)
    return figures


def default_processes(configs: dict[str, Config]) -> int:
    """How many worker processes the runs train on by default: one with a GPU; on a CPU one per usable core, at
    most :data:`MAX_PROCESSES`, and a number that divides every run's batch evenly (the first run splits its batch
    between them)."""
    if torch.cuda.is_available():
        return 1
    most = min(usable_cores(), MAX_PROCESSES)
    return max(n for n in range(1, most + 1) if all(c.train.batch_size % n == 0 for c in configs.values()))


def threads_per_process(processes: int) -> int:
    """Torch threads of each of ``processes`` worker processes: an equal share of the usable cores, at least one."""
    return max(1, usable_cores() // processes)


def run_demo(out: Path, data_dir: Path, fast: bool = False, runs: tuple[str, ...] = DEMO_RUNS,
             seed: int | None = None, processes: int | None = None, resume: bool = False) -> dict:
    """The whole main job; returns (and writes) the summary. ``seed``: every run's ``run.seed`` instead of the
    configs' (the shapes data stay those of seed 0). ``processes``: how many worker processes train the runs
    (default :func:`default_processes`): soft on all of them, data parallel, the others side by side; 1 trains in
    this process. ``resume``: a run whose folder holds a ``last.pt`` continues from it instead of starting over."""
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
    # one METEOR Java process scores every run here: it starts now and loads its tables while the data are made
    with meteor_kept():
        data_info = ensure_shapes(data_dir, num_images=FAST_DEMO_IMAGES if fast else DEMO_IMAGES)
        reset_stale_features(out / "features", data_info)
        common = (shapes_overrides(data_dir, out / "features") + (FAST_OVERRIDES if fast else [])
                  + ([] if seed is None else [f"run.seed={seed}"]))
        configs = {name: load_config(recipes()[f"demo_{name}"], common + [f"run.out={out / name}"] + (
            [f"train.init_from={out / STARTS_FROM[name] / 'best.pt'}"] if name in STARTS_FROM else [])) for name in runs}
        # Every run reads the features of the first run's encoder (the runs that fine-tune another keep its encoder).
        feature_seconds = cache_demo_features(load_config(recipes()[f"demo_{DEMO_RUNS[0]}"], common))
        print(f"features cached in {feature_seconds:.1f} s")
        summary: dict = {"runs": earlier_runs(out, keep=set(DEMO_RUNS) - set(runs)), "figures": [],
                         "feature_seconds": round(feature_seconds, 1)}
        # The figures show the first run of DEMO_RUNS (soft, unless an earlier demo in out trained it), drawn as soon
        # as its model is ready, while the other runs train.
        shown = next(name for name in DEMO_RUNS if name in runs or name in summary["runs"])

        def on_finished(name: str, row: dict) -> None:
            summary["runs"][name] = finished(name, row, started)
            if name == shown:
                summary["figures"] = figures_of(shown, Path(row["checkpoint"]), out, started,
                                                [n for n in configs if n not in summary["runs"]])
                summary["figures_after_seconds"] = round(time.perf_counter() - started, 1)

        if shown not in runs:                        # kept from an earlier demo: its figures drawn now
            summary["figures"] = figures_of(shown, Path(summary["runs"][shown]["checkpoint"]), out, started, list(configs))
        train_and_score(configs, out, processes or default_processes(configs), shown, resume, on_finished)
        summary["runs"] = {name: summary["runs"][name] for name in DEMO_RUNS if name in summary["runs"]}
        print("\n== comparison report ==")
        report = write_report([out / name for name in summary["runs"]], out / "report", stats_images=100,
                              images=FAST_REPORT_IMAGES if fast else REPORT_IMAGES)
        summary["report"] = report["html"]
        summary["total_seconds"] = round(time.perf_counter() - started, 1)
        write_file(out / "summary.json", json.dumps(summary, indent=2))
        print_summary(summary)
        print(f"\nwrote {out / 'summary.json'}")
        return summary


def train_and_score(configs: dict[str, Config], out: Path, processes: int, shown: str, resume: bool,
                    on_finished) -> None:
    """Train the runs of ``configs`` on ``processes`` worker processes (1: one after the other in this process),
    ``shown`` first where it is among them, and score each as its training ends, handing its summary row to
    ``on_finished(name, row)``."""
    if processes == 1:
        print(f"\n== training {len(configs)} run(s) one after the other in this process ==", flush=True)
        for name, config in configs.items():
            on_finished(name, score_run(name, train_run(name, config, resume=resume), out))
        return
    # The shown run on all processes, data parallel, first; then the others side by side, each on one.
    first = shown if shown in configs else next(iter(configs))
    apart = [name for name in configs if name != first]
    print(f"\n== training {len(configs)} run(s) on {processes} worker processes (one torch thread each): "
          f"{first!r} on all of them, data parallel"
          + (", then the others side by side, one process each ==" if apart else " =="), flush=True)
    plan = [(first, configs[first], processes)] + [(name, configs[name], 1) for name in apart]
    threads = torch.get_num_threads()
    with closing(train_on_workers(plan, out, processes, resume=resume)) as trained:
        for name, result, idle in trained:      # scored here while the next runs train on the workers
            torch.set_num_threads(max(1, idle))
            on_finished(name, score_run(name, result, out))
    torch.set_num_threads(threads)


def earlier_runs(out: Path, keep: set[str]) -> dict:
    """The summary rows of runs in ``keep`` that an earlier demo in ``out`` trained (their checkpoints still
    there), so that a demo of a few ``runs`` keeps the others in its summary and report."""
    path = out / "summary.json"
    rows = json.loads(path.read_text())["runs"] if path.exists() else {}
    return {name: row for name, row in rows.items() if name in keep and Path(row["checkpoint"]).exists()}


def train_run(name: str, config: Config, progress: bool = True, resume: bool = False, quiet: bool = False) -> dict:
    """Train one demo run (with ``resume``, on from its ``last.pt`` if it has one); :func:`train`'s result. Raises
    KeyboardInterrupt when a signal stopped the training (its resumable ``last.pt`` saved). ``quiet``: no banner
    (the other ranks of a run trained on several processes)."""
    entry, objective = DECODERS[config.model.decoder], config.train.objective
    kind = f"{entry.label}, attention: {entry.attention_kind(config.model.chosen)}"
    if objective == "scst":
        kind = f"self-critical fine-tuning of {Path(config.train.init_from).parent.name}"
    continuing = resume and (Path(config.run.out) / "last.pt").exists()
    if not quiet:
        print(f"\n== training '{name}' ({kind}){', on from its last.pt' if continuing else ''} ==", flush=True)
    result = train(config, resume=continuing, overwrite=not continuing, progress=progress)
    if result["stopped"]:
        raise KeyboardInterrupt
    return result


def score_run(name: str, result: dict, out: Path) -> dict:
    """Score the run :func:`train_run` trained on the test split; its row of the summary. A checkpoint whose test
    scores its folder already holds (a finished run that ``--resume`` trained no further) is not scored again."""
    scores = earlier_scores(out / name, result["checkpoint"])
    if scores is None:
        scores = evaluate_checkpoint(result["checkpoint"], "test", out_dir=out / name, progress=False)
    else:
        print(f"'{name}': the test scores of {Path(result['checkpoint']).name} kept from before", flush=True)
    return {**{k: scores.get(k) for k in SUMMARY_KEYS}, "ROUGE-L": scores.get("ROUGE-L"), "BLEU-1": scores.get("BLEU-1"),
            "train_seconds": round(result["train_seconds"], 1), "words_per_s": round(result["words_per_s"] or 0),
            "epochs": result["epochs"], "checkpoint": result["checkpoint"]}


def earlier_scores(folder: Path, checkpoint: str) -> dict | None:
    """The test scores in ``folder`` when they are those of ``checkpoint`` as it is now (its SHA-256 recorded in
    them), else None."""
    try:
        scores = json.loads((folder / "scores_test.json").read_text())
    except (OSError, ValueError):
        return None
    same = isinstance(scores, dict) and scores.get("checkpoint_sha256") == [checkpoint_digest(checkpoint)]
    return scores if same else None


def finished(name: str, row: dict, started: float) -> dict:
    """``row`` with the seconds since the demo started; says so."""
    elapsed = time.perf_counter() - started
    print(f"'{name}' trained and scored {elapsed / 60:.1f} min after the start (data and features included): "
          f"test BLEU-4 {row['BLEU-4']:.3f}, CIDEr {row['CIDEr']:.3f}", flush=True)
    return {**row, "done_after_seconds": round(elapsed, 1)}


def train_on_workers(plan: list[tuple[str, Config, int]], out: Path, slots: int,
                     resume: bool = False) -> Iterator[tuple[str, dict, int]]:
    """Train each run of ``plan`` (name, config, processes) on worker processes, ``slots`` at a time, each with
    :func:`threads_per_process` torch threads (several processes: data parallel over gloo). Runs
    start in ``plan``'s order as slots come free, one that starts from another (``STARTS_FROM``) once that one is
    trained. Yields ``(name, result, idle slots)`` as each run's training ends. Ctrl-C or SIGTERM makes every
    worker save a resumable ``last.pt`` and stop; a failing worker stops the others, its error raised here."""
    if any(size > slots for _, _, size in plan):
        raise ValueError(f"a run of the plan needs more than the {slots} worker slot(s)")
    context = multiprocessing.get_context("spawn")
    threads = threads_per_process(slots)
    waiting = list(plan)
    running: dict = {}              # the receiving end of a worker's pipe -> (run name, its process)
    pending: dict[str, int] = {}    # run -> ranks still running
    results: dict[str, dict] = {}   # run -> its rank 0's result
    trained: list[str] = []         # runs whose ranks are all done, not yet yielded
    with sigterm_as_keyboard_interrupt():
        try:
            while waiting or running or trained:
                while True:             # start every run that can start now, in the plan's order
                    unfinished = {name for name, *_ in waiting} | set(pending)
                    startable = [index for index, (name, _, size) in enumerate(waiting)
                                 if STARTS_FROM.get(name) not in unfinished and size <= slots - len(running)]
                    if not startable:
                        break
                    name, config, size = waiting.pop(startable[0])
                    start_workers(context, running, name, config, size, resume, threads)
                    pending[name] = size
                if trained:
                    name = trained.pop(0)
                    yield name, results.pop(name), slots - len(running)
                    continue
                for receiver in multiprocessing.connection.wait(list(running)):
                    name, process = running.pop(receiver)
                    result = worker_result(receiver, process, out / name)
                    if result is not None:
                        results[name] = result
                    pending[name] -= 1
                    if not pending[name]:
                        del pending[name]
                        trained.append(name)
        except BaseException:
            stop_workers([process for _, process in running.values()])
            raise


def start_workers(context, running: dict, name: str, config: Config, size: int, resume: bool, threads: int) -> None:
    """Start the ``size`` worker processes (ranks) of the run ``name``, each entered into ``running`` (the receiving
    end of its pipe -> ``(name, process)``) as soon as it has started."""
    port = free_port()
    for rank in range(size):
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(target=train_in_worker, name=f"demo-{name}-{rank}", args=(
            name, config, resume, rank, size, port, threads, sender))
        process.start()
        sender.close()
        running[receiver] = (name, process)


def worker_result(receiver, process, run_dir: Path) -> dict | None:
    """What a worker that has finished sent through ``receiver`` (rank 0: its run's result; other ranks: None),
    once joined; raises the worker's error, KeyboardInterrupt when it was interrupted, or a CaptionerError naming
    ``run_dir`` when it died without a word."""
    try:
        outcome = receiver.recv()
    except EOFError:                # it died without a word
        outcome = ("ended", None)
    process.join()
    if outcome[0] == "error":
        raise outcome[1]
    if outcome[0] == "interrupted":
        raise KeyboardInterrupt
    if outcome[0] != "trained":
        raise CaptionerError(f"{run_dir}: worker process {process.name} of demo run '{run_dir.name}' ended "
                             f"abruptly (exit code {process.exitcode}: killed, or out of memory?)")
    return outcome[1]


def stop_workers(processes: list, grace_seconds: float = 60.0) -> None:
    """SIGTERM to each worker (see :func:`train_in_worker`), then SIGKILL to any still running after
    ``grace_seconds`` (a rank waiting for a peer that is gone cannot act on SIGTERM)."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + grace_seconds
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for the workers' process group to meet at."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def train_in_worker(name: str, config: Config, resume: bool, rank: int, size: int, port: int, threads: int,
                    sender) -> None:
    """A worker process of :func:`train_on_workers`: rank ``rank`` of ``size`` (torchrun's environment variables
    set for it when ``size`` > 1), with ``threads`` torch threads, no progress bars and each printed line prefixed
    by ``[name]``. Rank 0 sends ``("trained", result)`` with :func:`train_run`'s result, the others
    ``("trained", None)``; any of them ``("error", error)`` or ``("interrupted", None)``.

    SIGTERM stops it after saving a resumable ``last.pt``."""
    if hasattr(os, "setpgrp"):
        os.setpgrp()                # out of the terminal's process group: Ctrl-C goes to the demo process only
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)
    if size > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE=str(size))
    set_up_process()        # as the CLI does, before torch starts this process's threads
    torch.set_num_threads(threads)
    prefix = f"[{name}] " if rank == 0 else f"[{name}, rank {rank}] "
    sys.stdout, sys.stderr = LinePrefixer(sys.stdout, prefix), LinePrefixer(sys.stderr, prefix)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    try:
        result = train_run(name, config, progress=False, resume=resume, quiet=rank > 0)
        sender.send(("trained", result if rank == 0 else None))
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
