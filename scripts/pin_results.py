"""After a recipe changed on purpose: keep the results made with it as it was, by naming in their keys the settings
that made them (:func:`captioner.results.record.pin`: overrides appended to each config key of RECIPE whose
settings changed, so that it resolves to what it resolved to then). The numbers stay what they were; probes are
still checked against the code (``scripts/render_results.py --check``). Results that the changed recipe should
make again (its study rows, its timing) are left out by naming the others.

    python scripts/pin_results.py flickr8k_full_soft                       # every result
    python scripts/pin_results.py flickr8k_full_soft scst_diagnosis_full   # these results only
"""

from __future__ import annotations

import argparse
import sys

from captioner.config import recipes
from captioner.results.record import RESULTS_DIR, load_results, pin, save


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", choices=sorted(recipes()))
    parser.add_argument("results", nargs="*", help="the results to pin (names in benchmarks/results; default: all)")
    args = parser.parse_args()
    saved = load_results()
    unknown = sorted(set(args.results) - set(saved))
    if unknown:
        print(f"{RESULTS_DIR}: no result {', '.join(unknown)}", file=sys.stderr)
        return 2
    for name in args.results or saved:
        record = saved[name]
        renamed = pin(record, args.recipe)
        if renamed:
            save(record)
            for old, new in renamed.items():
                print(f"{name}: {old!r} -> {new!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
