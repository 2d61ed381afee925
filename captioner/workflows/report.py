"""The report of ``captioner compare``: a side-by-side report of several training runs (Markdown with PNGs, and one
self-contained HTML page with the images embedded).

For each run directory (``config.yaml``, ``metrics.jsonl``, ``best.pt`` or ``last.pt``, ``scores_{split}.json``)
the report gives a metrics table, learning curves on shared axes, attention statistics (entropy of alpha per
word, histogram of the coverage ``sum_t alpha_ti``) and the same test images captioned by every run with their
attention figures. Each run is named by as many of its path's last components as tell it from the others.

A run's ``scores_{split}.json`` is used only when it names the run's checkpoint by its SHA-256, no config
overrides and this report's decode settings; otherwise the run is evaluated again, which writes
``captions_{split}.json`` and ``scores_{split}.json`` into the run folder as ``captioner evaluate`` does.
Everything else goes into the report folder.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import os
import re
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from captioner.checkpoint import checkpoint_digest, load_checkpoint
from captioner.core.files import write_file
from captioner.decoding.search import DecodeConfig
from captioner.errors import CaptionerError
from captioner.evaluation.attention_stats import attention_statistics
from captioner.export.folder import is_export
from captioner.predictor import Predictor
from captioner.visualisation.attention_figure import PNG_COMPRESSION
from captioner.workflows.evaluate import evaluate_checkpoint, split_dataset

log = logging.getLogger(__name__)

TABLE_COLUMNS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr", "object_precision",
                 "relation_accuracy", "pointing_accuracy", "train_seconds", "parameters", "words_per_s")


def _checkpoint_of(run_dir: Path) -> Path:
    """The run's ``best.pt`` (else ``last.pt``), or the folder itself when it is an exported model."""
    if is_export(run_dir):
        return run_dir
    for name in ("best.pt", "last.pt"):
        if (run_dir / name).exists():
            return run_dir / name
    raise CaptionerError(f"{run_dir}: no best.pt or last.pt (is it a run directory or an exported model?)")


def _json_error(path: Path, text: bytes, err: ValueError, first_line: int = 1) -> str:
    """``FILE: line N is not JSON (why)`` for ``err`` (a JSONDecodeError or UnicodeDecodeError) raised parsing
    ``text``, which starts at line ``first_line`` of ``path``."""
    if isinstance(err, json.JSONDecodeError):
        line, why = first_line + err.lineno - 1, f"column {err.colno}: {err.msg}"
    else:
        line, why = first_line + text.count(b"\n", 0, err.start), f"not UTF-8: {err.reason}"
    return f"{path}: line {line} is not JSON ({why})"


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of the run's ``metrics.jsonl`` (none without one). A last line that is not JSON, what a run
    killed while writing it or a full disk leaves, is skipped with a warning; any other bad line is an error."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    last = max((number for number, line in enumerate(lines, 1) if line.strip()), default=0)
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            if number != last:
                raise CaptionerError(_json_error(path, line, err, number)) from None
            log.warning("%s: skipped, a partial last line (the run stopped while writing it)",
                        _json_error(path, line, err, number))
            continue
        if not isinstance(record, dict):
            raise CaptionerError(f"{path}: line {number} is not a JSON object")
        records.append(record)
    return records


def _stored_scores(path: Path, checkpoint: Path, decode_config: DecodeConfig) -> dict | None:
    """The scores in ``path`` (a ``scores_{split}.json`` of ``captioner evaluate``) when they provably are those
    of ``checkpoint`` alone (``checkpoint_sha256``), without config overrides (``overrides``) and decoded with
    ``decode_config`` (``decode``); None when the file is missing, damaged (with a warning) or made otherwise."""
    if not path.exists():
        return None
    text = path.read_bytes()
    try:
        scores = json.loads(text)
    except ValueError as err:
        log.warning("%s; evaluating the run again", _json_error(path, text, err))
        return None
    if (isinstance(scores, dict) and scores.get("overrides") == [] and isinstance(scores.get("decode"), dict)
            and decode_config.same_as(scores["decode"])
            and scores.get("runtime", "torch") == "torch"
            and scores.get("checkpoint_sha256") == [checkpoint_digest(checkpoint)]):
        return scores
    log.info("%s: not known to be the scores of %s with beam %d and these decode settings; evaluating the run again",
             path, checkpoint, decode_config.beam)
    return None


def collect_run(run_dir: Path, name: str, split: str, beam: int | None, stats_images: int) -> dict:
    """Everything the report shows about one run, called ``name`` in it; ``beam`` None: the run's own
    ``decode.beam``. Evaluates the run on ``split`` unless its ``scores_{split}.json`` is this checkpoint's with
    these settings (see the module's docstring)."""
    checkpoint = _checkpoint_of(run_dir)
    metrics = read_metrics(run_dir)
    predictor = Predictor.load(checkpoint, beam=beam)
    model, vocab, config, decode_config = predictor.model, predictor.vocab, predictor.config, predictor.decode_config
    scores = _stored_scores(run_dir / f"scores_{split}.json", checkpoint, decode_config)
    if scores is None:
        scores = evaluate_checkpoint(checkpoint, split, beam=beam, out_dir=run_dir, progress=False)
    last = run_dir / "last.pt"   # the whole run's training time, not the time up to the best epoch
    progress = load_checkpoint(last if last.exists() else checkpoint).get("progress", {})
    val = [m for m in metrics if m.get("type") == "val"]
    dataset = split_dataset(config, split, vocab, model)
    generations = predictor.generate(dataset, max_images=stats_images)
    stats = attention_statistics(generations) or {"coverage": []}
    stats.update({k: v for k, v in (scores.get("attention") or {}).items() if k != "coverage"})  # the whole split's
    return {
        "name": name, "dir": run_dir, "checkpoint": checkpoint, "config": config, "predictor": predictor, "model": model,
        "vocab": vocab, "decode_config": decode_config, "scores": scores, "metrics": metrics, "stats": stats,
        "train_seconds": progress.get("train_seconds"),
        "parameters": sum(p.numel() for p in model.decoder.parameters()),   # trained weights, buffers excluded
        "words_per_s": next((m["words_per_s"] for m in reversed(val) if m.get("words_per_s")), None),
    }


def run_names(run_dirs: list[Path]) -> list[str]:
    """Each run's name in the report: its folder's name, or as many of the last components of its path as it
    takes to tell it from the other runs (``a/run`` and ``b/run``, not ``run`` twice)."""
    given: dict[Path, Path] = {}
    for run_dir in run_dirs:
        if run_dir.resolve() in given:
            raise CaptionerError(f"{run_dir}: the same run as {given[run_dir.resolve()]}, given twice")
        given[run_dir.resolve()] = run_dir
    parts = [Path(os.path.abspath(run_dir)).parts[1:] for run_dir in run_dirs]
    depths = [1] * len(run_dirs)
    while True:
        names = ["/".join(p[-depth:]) for p, depth in zip(parts, depths)]
        clashing = [i for i, name in enumerate(names) if names.count(name) > 1]
        if not clashing:
            return names
        for i in clashing:
            depths[i] += 1


def _save(figure: Figure, path: Path) -> Path:
    FigureCanvasAgg(figure)
    write_file(path, lambda handle: figure.savefig(handle, format="png", dpi=100, bbox_inches="tight",
                                                   pil_kwargs={"compress_level": PNG_COMPRESSION}))
    return path


def learning_curves(runs: list[dict], path: Path) -> Path:
    """Training loss per step and validation score per epoch, every run on the same axes; with a self-critical
    run, its mean sampled reward and baseline per step in a third panel."""
    steps = {run["name"]: [m for m in run["metrics"] if m.get("type") == "train"] for run in runs}
    rewarded = any("reward" in m and m.get("objective") == "scst" for records in steps.values() for m in records)
    figure = Figure(figsize=(16 if rewarded else 11, 3.6))
    axes = figure.subplots(1, 3 if rewarded else 2)
    loss_ax, val_ax = axes[0], axes[1]
    metric = runs[0]["config"].train.metric
    for run in runs:
        crossed = [m for m in steps[run["name"]] if "cross_entropy" in m]
        val = [m for m in run["metrics"] if m.get("type") == "val"]
        if crossed:
            loss_ax.plot([m["step"] for m in crossed], [m["cross_entropy"] for m in crossed], label=run["name"])
        if val:
            val_ax.plot([m["epoch"] for m in val], [m.get(metric) for m in val], marker="o", label=run["name"])
        scst = [m for m in steps[run["name"]] if m.get("objective") == "scst" and "reward" in m]
        if rewarded and scst:
            line, = axes[2].plot([m["step"] for m in scst], [m["reward"] for m in scst], label=f"{run['name']} reward")
            axes[2].plot([m["step"] for m in scst], [m["baseline"] for m in scst], linestyle="--", color=line.get_color(),
                         label=f"{run['name']} baseline")
    loss_ax.set(title="training cross-entropy (per word)", xlabel="step", ylabel="nats")
    val_ax.set(title=f"validation {metric}", xlabel="epoch")
    if rewarded:
        axes[2].set(title="self-critical reward (CIDEr-D of samples)", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    return _save(figure, path)


def coverage_histogram(runs: list[dict], path: Path) -> Path:
    """Histogram of ``sum_t alpha_ti`` over test images and regions, one outline per run."""
    figure = Figure(figsize=(6, 3.6))
    ax = figure.subplots()
    values = [np.asarray(r["stats"]["coverage"]) for r in runs if r["stats"]["coverage"]]
    top = max((v.max() for v in values), default=1.0)
    bins = np.linspace(0, max(top, 1.0), 40)
    for run in runs:
        if run["stats"]["coverage"]:
            ax.hist(run["stats"]["coverage"], bins=bins, histtype="step", linewidth=1.5, label=run["name"], density=True)
    ax.set(title="attention coverage per region (sum over words)", xlabel="sum_t alpha_ti", ylabel="density")
    if values:
        ax.legend()
    else:       # no run's decoder reports attention
        ax.text(0.5, 0.5, "no attention maps", ha="center", va="center", transform=ax.transAxes)
    return _save(figure, path)


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _row(run: dict) -> dict:
    return {**run["scores"], "train_seconds": run["train_seconds"], "parameters": run["parameters"],
            "words_per_s": run["words_per_s"]}


def example_figures(runs: list[dict], records, out_dir: Path) -> list[dict]:
    """The same images captioned by every run, each with its attention figure
    (``attention_{run's number}_{its name}_{image id}.png``: names made safe for Markdown links)."""
    examples = []
    for record in records:
        row = {"image": record.path, "runs": []}
        for number, run in enumerate(runs, 1):
            safe_name = re.sub(r"[^\w.-]", "_", run["name"])
            figure = out_dir / f"attention_{number}_{safe_name}_{record.image_id}.png"
            result = run["predictor"].attend(record.path, figure, title=f"{run['name']}: ")
            row["runs"].append({"name": run["name"], "caption": result.caption, "figure": figure})
        examples.append(row)
    return examples


def report_markdown(runs: list[dict], pictures: dict[str, Path], examples: list[dict], split: str,
                    stats_images: int) -> str:
    columns = [c for c in TABLE_COLUMNS if any(_row(r).get(c) is not None for r in runs)]
    beams = sorted({r["decode_config"].beam for r in runs})
    lines = ["# Run comparison", "", f"Split: `{split}`, beam {', '.join(map(str, beams))}.", "", "## Metrics", "",
             "| run | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 1)]
    lines += ["| " + run["name"] + " | " + " | ".join(_cell(_row(run).get(c)) for c in columns) + " |" for run in runs]
    lines += ["", "## Learning curves", "", f"![learning curves]({pictures['curves'].name})", "",
              "## Attention statistics", "",
              "Over the split's captions (the histogram: the first " f"{stats_images} images'): the entropy of each "
              "word's map (uniform: log L), its largest weight as a multiple of a uniform map's 1/L, and per caption "
              "the largest sum over words of one region's weight.", "",
              "| run | regions L | mean entropy (nats) | uniform entropy | peak / uniform | max coverage per caption |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {_cell(r['stats'].get('regions'))} | {_cell(r['stats'].get('mean_entropy'))} | "
              f"{_cell(r['stats'].get('uniform_entropy'))} | {_cell(r['stats'].get('peak_ratio'))} | "
              f"{_cell(r['stats'].get('mean_max_coverage'))} |" for r in runs]
    lines += ["", f"![coverage]({pictures['coverage'].name})", "", "## Same images, every run", ""]
    for example in examples:
        lines += [f"### {Path(example['image']).name}", ""]
        for item in example["runs"]:
            lines += [f"**{item['name']}**: {item['caption']}", "", f"![{item['name']}]({item['figure'].name})", ""]
    return "\n".join(lines) + "\n"


def write_report(run_dirs: list[str | Path], out_dir: str | Path, *, split: str = "test", beam: int | None = None,
                 images: int = 3, stats_images: int = 200) -> dict:
    """Write ``report.md``, ``report.html`` and the PNGs into ``out_dir`` (the report and the summary figures
    replaced whole or not at all); returns the report's paths and each run's table row by its name.
    ``beam`` None: each run decodes with its own ``decode.beam``. ``images``: how many of the split's first
    images every run captions (0: none). A run without a matching ``scores_{split}.json`` is evaluated, writing
    it and ``captions_{split}.json`` into the run folder (see the module's docstring)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_dirs = [Path(d) for d in run_dirs]
    runs = [collect_run(d, name, split, beam, stats_images) for d, name in zip(run_dirs, run_names(run_dirs))]
    pictures = {"curves": learning_curves(runs, out_dir / "learning_curves.png"),
                "coverage": coverage_histogram(runs, out_dir / "coverage.png")}
    first = runs[0]
    records = split_dataset(first["config"], split, first["vocab"], first["model"]).records[:images]
    markdown = report_markdown(runs, pictures, example_figures(runs, records, out_dir), split, stats_images)
    page = _html(markdown, out_dir)
    write_file(out_dir / "report.md", markdown)
    write_file(out_dir / "report.html", page)
    return {"markdown": str(out_dir / "report.md"), "html": str(out_dir / "report.html"),
            "runs": {r["name"]: _row(r) for r in runs}}


def _html(markdown: str, folder: Path) -> str:
    """A small Markdown-subset renderer (headings, tables, images, bold, paragraphs), images inlined."""
    body, table = [], []

    def inline(text: str) -> str:
        text = html.escape(text)
        parts = text.split("**")
        return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts)).replace("`", "")

    def flush_table():
        if table:
            rows = [r for r in table if not set(r.replace("|", "").strip()) <= set("-")]
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
            head = "".join(f"<th>{inline(c)}</th>" for c in cells[0])
            rest = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in row) + "</tr>" for row in cells[1:])
            body.append(f"<table><tr>{head}</tr>{rest}</table>")
            table.clear()

    for line in markdown.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush_table()
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{inline(line[level:].strip())}</h{level}>")
        elif line.startswith("!["):
            alt, src = line[2:].split("](")
            data = base64.b64encode((folder / src.rstrip(")")).read_bytes()).decode()
            body.append(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">')
        elif line.strip():
            body.append(f"<p>{inline(line)}</p>")
    flush_table()
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
             "img{max-width:100%}")
    return f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>captioner comparison</title><style>{style}</style></head><body>{''.join(body)}</body></html>\n"
