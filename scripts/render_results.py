"""Render every results table into its page from its JSON (:mod:`captioner.results.render`), or check them.

    python scripts/render_results.py            # rewrite the tables from their JSON
    python scripts/render_results.py --check    # change nothing; exit 1 naming each table that differs from its
                                                # JSON and each result whose settings or code behaviour changed
"""

from __future__ import annotations

import argparse
import sys

from captioner.results.record import ROOT
from captioner.results.render import render_pages, stale_results, table_differences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table or result is stale")
    args = parser.parse_args()
    if args.check:
        found = table_differences() + stale_results()
        print("\n\n".join(found) if found else "every results table is what its JSON renders, and every result is "
                                              "current", file=sys.stderr if found else sys.stdout)
        return 1 if found else 0
    for page in render_pages():
        print(f"rendered the results tables of {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
