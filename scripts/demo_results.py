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

from captioner.results.record import write_result

ROOT = Path(__file__).resolve().parent.parent
ROW_KEYS = ("BLEU-1", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr", "object_precision", "relation_accuracy",
            "pointing_accuracy", "epochs", "train_seconds", "done_after_seconds")
# What made the demo's numbers: its recipes (soft_scst fine-tunes soft's model), and the code they run, reading
# cached features; the shapes data, its data path, the words and the measures.
CONFIGS = ["demo_soft", "demo_none", "demo_hard", "demo_transformer", "demo_soft_scst --init-from demo_soft"]
PROBES = ["shapes", "text", "metrics", "data demo_soft",
          *(f"{probe} {config} data.features=features" for config in CONFIGS for probe in ("train", "decode"))]


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
    path = write_result("demo", demo_result(summary), configs=CONFIGS, probes=PROBES, command=command,
                        date=args.summary.stat().st_mtime, commit=args.commit)
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
