"""Ensembles of the Flickr8k study's runs (``scripts/flickr8k_study.py``): their best checkpoints decoded together
(each step averages the members' word probabilities: ``captioner.decoding.ensemble``) and scored on all 1,000
validation photos, as ``captioner evaluate --checkpoint A.pt --checkpoint B.pt ...`` does. Each ensemble is
written, with its members, their summed training time from the study's JSON and the machine, into
``benchmarks/results/flickr8k_ensembles.json`` beside the ensembles scored before (those scored with other versions of the code are dropped, and named); the
docs' results page renders it. The members' checkpoints must still be in ``runs/flickr8k_full`` (they are never
committed).

    python scripts/flickr8k_ensemble.py soft_s0 soft_s1 soft_s2
    python scripts/render_results.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flickr8k_study import KINDS, METRICS, RESULTS, RUNS, made_by

from captioner.core.process import set_up_process
from captioner.results.record import RESULTS_DIR, add_entry, load_results

ROOT = Path(__file__).resolve().parent.parent

ENSEMBLES = "flickr8k_ensembles"


def score(members: list[str], study: dict) -> dict:
    """The ensemble of the study's runs ``members`` (``study``: its saved runs by name) on all validation photos
    (beam and decoding of the first)."""
    from captioner.workflows.evaluate import evaluate_checkpoint

    missing = [m for m in members if m not in study or not (RUNS / m / "best.pt").is_file()]
    if missing:
        raise SystemExit(f"{', '.join(missing)}: not a run of {RESULTS_DIR / (RESULTS + '.json')} with its best.pt "
                         f"in {RUNS}")
    val = evaluate_checkpoint([RUNS / m / "best.pt" for m in members], "val",
                              out_dir=ROOT / "runs" / "ensembles" / "+".join(members), progress=False)
    return {"members": members, "validation_images": val["images"],
            "val": {k: round(val[k], 4) for k in METRICS},
            "diversity": {k: round(v, 4) for k, v in val["diversity"].items()},
            "members_train_cpu_seconds": round(sum(study[m]["train_cpu_seconds"] for m in members), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("members", nargs="+", help="runs of the study, e.g. soft_s0 transformer_s0")
    args = parser.parse_args()
    study = load_results()[RESULTS]["result"]["runs"]
    entry = score(args.members, study)
    print(json.dumps(entry, indent=1))
    made = [made_by(study[m]["kind"], study[m]["ablation"]) for m in args.members]     # what made each member
    recipes = dict.fromkeys(KINDS[study[m]["kind"]] for m in args.members)
    add_entry(ENSEMBLES, "ensembles", "+".join(args.members), entry,
              configs=list(dict.fromkeys(config for configs, _ in made for config in configs)),
              probes=[*dict.fromkeys(probe for _, probes in made for probe in probes), f"ensemble {' '.join(recipes)}"])


if __name__ == "__main__":
    set_up_process()    # as every captioner command: its times are those of captioner train
    main()
