"""After a probe itself changed (what :mod:`captioner.results.fingerprint` computes, not the code it probes): record
in every result what its probes compute now. The numbers stay what they were.

Sound only where the code the probes run is the code that passed the results check under the old probes: run it
from a clone whose last commit passes ``python scripts/render_results.py --check``, with the probes' module as the
only change under ``captioner/`` (the script refuses otherwise), and commit the probes and the results together.
A result whose settings no longer resolve as recorded is left as it is and named (it is stale for another reason).

    python scripts/reprobe_results.py              # every result
    python scripts/reprobe_results.py demo scst    # these results only
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from captioner.errors import CaptionerError
from captioner.results.record import RESULTS_DIR, load_results, reprobe, save

ROOT = Path(__file__).resolve().parent.parent
PROBES_MODULE = "captioner/results/fingerprint.py"


def changed_code() -> list[str]:
    """The files under ``captioner/`` that differ from the last commit, the probes' module aside."""
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "captioner"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    return [line[3:] for line in done.stdout.splitlines() if line[3:] != PROBES_MODULE]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="*",
                        help="the results to probe again (names in benchmarks/results; default: all)")
    args = parser.parse_args()
    changed = changed_code()
    if changed:
        print(f"{ROOT}: the code the probes run has changed since the last commit ({', '.join(changed)}); only "
              f"{PROBES_MODULE} may differ", file=sys.stderr)
        return 2
    saved = load_results()
    unknown = sorted(set(args.results) - set(saved))
    if unknown:
        print(f"{RESULTS_DIR}: no result {', '.join(unknown)}", file=sys.stderr)
        return 2
    failed = 0
    for name in args.results or saved:
        record = saved[name]
        try:
            moved = reprobe(record)
        except CaptionerError as err:
            print(f"{err}; left as it is", file=sys.stderr)
            failed += 1
            continue
        save(record)
        print(f"{name}: {len(moved)} of {len(record['fingerprint'])} probes compute other numbers now; recorded",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
