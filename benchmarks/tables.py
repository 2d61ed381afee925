"""The tables the docs show, one function per result (``benchmarks/results/NAME.json``): each takes the result's
``result`` block and returns the Markdown table's lines. ``scripts/render_results.py`` writes them between a page's
``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` with a footnote naming the command and the machine.

A new study plugs in with a function here, registered in :data:`TABLES` under its result's name, and the two
markers where its table belongs."""

from __future__ import annotations

from collections.abc import Callable


def row(*cells) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def header(*names: str) -> list[str]:
    return [row(*names), row(*("---" for _ in names))]


def number(value, digits: int = 3) -> str:
    """``value`` to ``digits`` decimals, or a dash where it was not measured."""
    return "–" if value is None else f"{value:.{digits}f}"


def demo(result: dict) -> list[str]:
    """The demo's runs on the shapes test split, by name: scores, shapes measures, epochs and time; then the whole
    demo's time (data, features, training, scoring, report)."""
    lines = header("run", "BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr", "object precision", "relation accuracy",
                   "pointing accuracy", "epochs", "train s", "done after s")
    for name, scores in result["runs"].items():
        lines.append(row(f"`{name}`", *(number(scores[key]) for key in ("BLEU-1", "BLEU-4", "METEOR",
                                                                                     "ROUGE-L")),
                         number(scores["CIDEr"], 2), *(number(scores[key]) for key in (
                             "object_precision", "relation_accuracy", "pointing_accuracy")),
                         scores["epochs"], f"{scores['train_seconds']:.0f}", f"{scores['done_after_seconds']:.0f}"))
    lines.append(row("whole demo", *([""] * 10),
                     f"{result['total_seconds']:.0f}"))
    return lines


def scaling(result: dict) -> list[str]:
    """Step time of the soft LSTM as caption length T, regions L or batch B grows, with the fitted exponent."""
    axes = {"T": "T (words)", "L": "L (regions)", "B": "B (captions)"}
    lines = header("grows", "values", "step time (s)", "exponent k")
    for axis, label in axes.items():
        rows = result["growth"][axis]["rows"]
        lines.append(row(label, ", ".join(str(r[axis]) for r in rows), ", ".join(f"{r['step_s']:.2f}" for r in rows),
                         f"{result['growth'][axis]['exponent']:.2f}"))
    return lines


def scst(result: dict) -> list[str]:
    """Where a self-critical training step's time goes, with each baseline."""
    parts = {"sample": "sampling", "reward": "CIDEr-D reward", "greedy": "greedy captions",
             "backward_and_adam": "backward and Adam"}
    lines = header("baseline", "images/s", "step s", *parts.values())
    for name, label in (("mean_baseline", "mean of the other samples"), ("greedy_baseline", "greedy caption")):
        measured = result[name]
        lines.append(row(label, f"{measured['images_per_s']:.1f}", f"{measured['step_s']:.2f}",
                         *(f"{100 * measured['share'][part]:.1f} %" for part in parts)))
    return lines


def decode_beside_python(result: dict) -> list[str]:
    """A batch's decoding alone, beside a busy Python thread of the same process, beside a busy process."""
    settings = {"alone": "alone", "beside_a_python_thread": "beside a busy Python thread of the same process",
                "beside_a_python_process": "beside a busy process"}
    alone = result["ms_per_image"]["alone"]
    lines = header("decoding", "ms per image (median of the rounds)", "slower than alone")
    for key, label in settings.items():
        value = result["ms_per_image"][key]
        lines.append(row(label, f"{value:,.1f}", f"{value / alone:,.2f}x"))
    return lines


TABLES: dict[str, Callable[[dict], list[str]]] = {
    "demo": demo, "scaling": scaling, "scst": scst, "decode_beside_python": decode_beside_python}
