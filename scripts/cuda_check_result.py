"""Gather what ``scripts/cuda_check.sh`` left in its output folders into the result ``cuda_check``
(``benchmarks/results/cuda_check.json``), which the results page renders.

A check's folder holds ``steps.txt``, one log per step and the benchmark JSON it wrote on the GPU machine; that
JSON's machine block (GPU, CPU, torch, commit) becomes the result's. Given several folders (a rerun with ``SKIP``
after a partial check), a step run in a later folder replaces the same step of an earlier one; skipped steps replace
nothing.

    python scripts/cuda_check_result.py FOLDER [FOLDER ...]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from captioner.results.record import RESULTS_DIR, made_by, save

STEP = re.compile(r"^(\S+): exit (\d+) in (\d+) s \(limit (\d+) s\)$")
EPOCH = re.compile(r"^epoch (\d+)/\d+: .*CIDEr ([\d.]+) \| (\d+) words/s")
PRECISION = re.compile(r"precision: (.+?); compile: (\w+)")
TRAINING_STEPS = ("torchrun_nccl", "train_fp32", "train_amp_auto", "train_amp_auto_compiled")
BENCHMARKS = {"lstm_decoder": "bench_decoder", "scaling": "bench_scaling", "feature_cache": "bench_feature_cache"}
"""The result each benchmark step writes, by the step's name."""


def steps(folder: Path) -> dict[str, dict]:
    """Each step that ran in ``folder``: its exit status, seconds and time limit."""
    found = {}
    for line in (folder / "steps.txt").read_text().splitlines():
        if match := STEP.match(line.strip()):
            name, code, seconds, limit = match.groups()
            found[name] = {"exit": int(code), "seconds": int(seconds), "limit": int(limit), "folder": folder}
    return found


def training(log: Path) -> dict:
    """A ``captioner train`` step's precision, whether it compiled, and each epoch's validation CIDEr and words/s."""
    text = log.read_text()
    precision = PRECISION.search(text)
    epochs = [{"epoch": int(e), "CIDEr": float(c), "words_per_s": int(w)}
              for e, c, w in (m.groups() for m in map(EPOCH.match, text.splitlines()) if m)]
    return {"precision": precision[1] if precision else None,
            "compile": precision[2] == "True" if precision else None, "epochs": epochs}


def gather(folders: list[Path]) -> tuple[dict, dict | None]:
    """The result's payload and the machine block of the GPU machine (from a benchmark JSON of the check)."""
    ran: dict[str, dict] = {}
    for folder in folders:
        ran |= steps(folder)
    machine, benchmarks = None, {}
    for result, step in BENCHMARKS.items():
        if step in ran and ran[step]["exit"] == 0 and (path := ran[step]["folder"] / f"{result}.json").exists():
            record = json.loads(path.read_text())
            benchmarks[result] = record["result"]
            machine = machine or record["machine"]
    payload = {"steps": {name: {key: value for key, value in step.items() if key != "folder"}
                         for name, step in ran.items()},
               "training": {name: training(ran[name]["folder"] / f"{name}.log")
                            for name in TRAINING_STEPS if name in ran and ran[name]["exit"] == 0}}
    if "demo_soft" in ran and (summary := ran["demo_soft"]["folder"] / "demo_summary.json").exists():
        demo = json.loads(summary.read_text())
        payload["demo_soft"] = {**demo["runs"]["soft"], "total_seconds": demo["total_seconds"]}
        payload["demo_soft"].pop("checkpoint", None)
    scores = {}
    for compiled in ("false", "true"):
        step = f"evaluate_decode_compile_{compiled}"
        path = ran[step]["folder"] / f"scores_test_decode_compile_{compiled}.json" if step in ran else None
        if path and path.exists():
            scored = json.loads(path.read_text())
            scores[compiled] = {key: scored[key] for key in ("images", "BLEU-4", "CIDEr", "pointing_accuracy")}
    if scores:
        payload["decode_compile"] = scores
    payload["benchmarks"] = benchmarks
    return payload, machine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, help="cuda_check.sh output folders, oldest first")
    args = parser.parse_args()
    payload, machine = gather(args.folders)
    if machine is None:
        print("cuda_check_result: no benchmark of the check finished, so the GPU machine is unknown", file=sys.stderr)
        return 1
    record = {"name": "cuda_check", "command": "scripts/cuda_check.sh", "machine": machine,
              **made_by(["demo_soft"], ["train demo_soft data.features=features",
                                        "decode demo_soft data.features=features"]),
              "result": payload}
    print(f"wrote {save(record, RESULTS_DIR)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
