"""Turn a demo's ``summary.json`` into the result the docs' demo table shows (``benchmarks/results/demo.json``): its
runs' test scores, epochs and times, with the machine block of this machine (run it where the demo ran, after it) and
the date the summary was written.

    captioner demo --out runs/demo && python scripts/demo_results.py runs/demo/summary.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from results import write_result  # noqa: E402

from captioner.config import recipes  # noqa: E402

ROW_KEYS = ("BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr", "object_precision", "relation_accuracy",
            "pointing_accuracy", "epochs", "train_seconds", "done_after_seconds")
# What the demo's numbers depend on beside the recipes: the runner and the data it generates.
DEMO_CODE = ("captioner/commands/demo.py", "captioner/commands/demo_job.py", "captioner/data/shapes.py")


def demo_result(summary: dict) -> dict:
    """The part of a demo summary the table shows (no checkpoint paths: they name the machine's folders)."""
    return {"runs": {name: {key: row.get(key) for key in ROW_KEYS} for name, row in summary["runs"].items()},
            "feature_seconds": summary["feature_seconds"], "figures_after_seconds": summary.get("figures_after_seconds"),
            "total_seconds": summary["total_seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("summary", type=Path, help="the summary.json of a `captioner demo` run")
    parser.add_argument("--command", help="the command that ran the demo (default: captioner demo --out FOLDER, the "
                                          "summary's folder)")
    parser.add_argument("--commit", help="the commit of the checkout that ran the demo (default: this checkout's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run's process, as the machine "
                        "block records them (default 1: a demo on a CPU trains in worker processes of one thread each)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    summary = json.loads(args.summary.read_text())
    command = args.command or shlex.join(["captioner", "demo", "--out", str(args.summary.parent)])
    demo_recipes = [path for name, path in recipes().items() if name.startswith("demo_")]
    path = write_result("demo", demo_result(summary), inputs=[*demo_recipes, *DEMO_CODE], command=command,
                        date=args.summary.stat().st_mtime, commit=args.commit)
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
