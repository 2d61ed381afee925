"""The results tables of the docs, rendered from their JSON: between ``<!-- results:NAME -->`` and
``<!-- /results:NAME -->`` in README.md and the pages under docs/, the table of ``benchmarks/results/NAME.json``
(its format: :mod:`captioner.results.tables`) and a footnote naming the command and the machine (on the docs pages
also the date and the commit; the README names neither)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from captioner.results.record import RESULTS_DIR, ROOT, load_results, why_stale
from captioner.results.tables import TABLES

TABLE = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


def pages(root: Path = ROOT) -> dict[Path, bool]:
    """The pages that may hold results tables, each with whether its footnotes name the date and the commit (the
    docs pages) or not (README.md)."""
    found = {root / "README.md": False}
    found.update({page: True for page in sorted((root / "docs").rglob("*.md"))})
    return {page: dated for page, dated in found.items() if page.is_file()}


def machine_words(machine: dict) -> str:
    """The machine of a result in words: CPU, cores and vector extensions, torch threads, GPU, torch."""
    flags = f"; {', '.join(machine['cpu_flags'])}" if machine["cpu_flags"] else ""
    threads = f"{machine['threads']} torch thread{'s' if machine['threads'] != 1 else ''}"
    gpu = ", ".join(machine["gpu"]) if machine["gpu"] else "no GPU"
    return f"{machine['cpu']} ({machine['cores']} cores{flags}), {threads}, {gpu}, torch {machine['torch']}"


def render_table(record: dict, dated: bool) -> str:
    """The table of ``record`` and its footnote, as the text between the markers."""
    machine = record["machine"]
    when = f"; {machine['date']}, commit {machine['commit'][:10]}" if dated and machine.get("commit") else ""
    lines = TABLES[record["name"]](record["result"])
    return "\n".join(lines) + f"\n\n*`{record['command']}` on {machine_words(machine)}{when}.*\n"


def render_page(text: str, records: dict[str, dict], dated: bool) -> str:
    """``text`` with every results table rendered from ``records``; a KeyError names a table without a result or
    without a format."""
    def rendered(match: re.Match) -> str:
        name = match["name"]
        if name not in records:
            raise KeyError(f"results table '{name}' has no result: no {RESULTS_DIR.name}/{name}.json")
        if name not in TABLES:
            raise KeyError(f"results table '{name}' has no format in captioner/results/tables.py")
        return match[1] + render_table(records[name], dated) + match[4]

    return TABLE.sub(rendered, text)


def render_pages(root: Path = ROOT, results_dir: Path = RESULTS_DIR) -> list[Path]:
    """Rewrite every page's tables from the results; returns the pages that changed."""
    records, changed = load_results(results_dir), []
    for page, dated in pages(root).items():
        text = page.read_text()
        rendered = render_page(text, records, dated)
        if rendered != text:
            page.write_text(rendered)
            changed.append(page)
    return changed


def table_differences(root: Path = ROOT, results_dir: Path = RESULTS_DIR) -> list[str]:
    """Each page whose tables differ from what their results render, with the diff, or that names a result that
    does not exist."""
    records = load_results(results_dir)
    found = []
    for page, dated in pages(root).items():
        text = page.read_text()
        try:
            expected = render_page(text, records, dated)
        except KeyError as missing:
            found.append(f"{page.relative_to(root)}: {missing.args[0]}")
            continue
        if expected != text:
            diff = difflib.unified_diff(text.splitlines(), expected.splitlines(), "committed", "rendered", lineterm="")
            found.append(f"{page.relative_to(root)}: a results table differs from what its JSON renders (edited by "
                         f"hand, or the JSON is newer: python scripts/render_results.py)\n" + "\n".join(diff))
    return found


def stale_results(results_dir: Path = RESULTS_DIR) -> list[str]:
    """Each result whose settings or code behaviour changed since it was measured, why, and how to measure it
    again."""
    return [f"{results_dir.name}/{name}.json is stale: {'; '.join(reasons)}. Run it again: {record['command']}"
            for name, record in load_results(results_dir).items() if (reasons := why_stale(record))]
