"""Render every results table into its page: between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` in
README.md and the pages under docs/, the table of ``benchmarks/results/NAME.json`` (its format:
``benchmarks/tables.py``) and a footnote naming the command and the machine it was measured on (on the docs pages
also the date and the commit; the README names neither).

    python scripts/render_results.py            # rewrite the tables from their JSON
    python scripts/render_results.py --check    # change nothing; exit 1 naming each table that differs from its
                                                # JSON and each result whose recipe or code changed since it ran
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from results import RESULTS_DIR, load_results, stale_inputs  # noqa: E402
from tables import TABLES  # noqa: E402

TABLE = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


def pages(root: Path = ROOT) -> dict[Path, bool]:
    """The pages that may hold results tables, each with whether its footnotes name the date and the commit (the
    docs pages) or not (README.md, which names no date and no commit)."""
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
            raise KeyError(f"results table '{name}' has no format in benchmarks/tables.py")
        return match[1] + render_table(records[name], dated) + match[4]

    return TABLE.sub(rendered, text)


def differences(root: Path = ROOT, results_dir: Path = RESULTS_DIR) -> list[str]:
    """What ``--check`` reports: each page whose tables differ from their results (with the diff), each result
    whose inputs changed since it was measured."""
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
    for name, record in records.items():
        stale = stale_inputs(record, root)
        if stale:
            found.append(f"{results_dir.name}/{name}.json: measured with other versions of {', '.join(stale)} than "
                         f"these; run it again: {record['command']}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table or result is stale")
    args = parser.parse_args()
    if args.check:
        found = differences()
        print("\n\n".join(found) if found else "every results table is what its JSON renders, and every result is "
                                              "current", file=sys.stderr if found else sys.stdout)
        return 1 if found else 0
    records = load_results()
    for page, dated in pages().items():
        text = page.read_text()
        rendered = render_page(text, records, dated)
        if rendered != text:
            page.write_text(rendered)
            print(f"rendered the results tables of {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
