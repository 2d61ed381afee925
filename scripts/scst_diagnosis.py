"""Why does self-critical training lose on real photos? Finished runs side by side: cross-entropy starts and the
SCST runs made from them, each trained by ``captioner train`` with the overrides its ``config.yaml`` records against
its recipe (``flickr8k_soft`` for cross-entropy, ``flickr8k_soft_scst`` for SCST). Per run: what it changed,
validation CIDEr per epoch (the subset decoded during training), for SCST the mean reward and the share of samples
cut at the length limit in its last epoch, and its best checkpoint on every validation photo decoded twice: with the
cross-entropy recipe's ``decode`` section (beam 3, ``max_length`` 22, ``block_ngram`` 2, ``no_dangling_end``) and
with the SCST recipe's (beam 3, ``max_length`` 16), so that an SCST model and its start are compared under the same
decoding rules.

    python scripts/scst_diagnosis.py runs/diag/xe_ls01 runs/diag/scst_recipe ... --save scst_diagnosis

Never commit what the runs write (runs/): the photos are for research use only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml
from hard_attention_diagnosis import differences

from captioner.config import load_config, recipes
from captioner.results.record import write_result
from captioner.workflows.evaluate import evaluate_checkpoint

XE, SCST = "flickr8k_soft", "flickr8k_soft_scst"
# a run's changes against its recipe that shape no number of its training step or decoding
LENGTH_AND_START = ("train.epochs=", "train.val_max_images=", "train.init_from=", "run.seed=",
                    "data.features=", "data.max_val_images=")
DECODINGS = {recipe: load_config(recipes()[recipe]).to_dict()["decode"] for recipe in (XE, SCST)}
"""The two decodings of each best checkpoint: the cross-entropy recipe's ``decode`` section and the SCST recipe's."""


def decode_overrides(decode: dict) -> list[str]:
    return [f"decode.{key}={json.dumps(value)}" for key, value in decode.items()]


def scored_run(folder: Path) -> dict:
    """One finished run: its changes against its recipe, its validation curve and SCST statistics, and its best
    checkpoint on all validation photos with each of :data:`DECODINGS`."""
    config = yaml.safe_load((folder / "config.yaml").read_text())
    recipe = SCST if config["train"]["objective"] == "scst" else XE
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    curve = [r for r in records if r["type"] == "val"]
    sampled = [r for r in records
               if r["type"] == "train" and r["objective"] == "scst" and r["epoch"] == curve[-1]["epoch"]]
    row = {"run": folder.name, "recipe": recipe, "init_from": config["train"].get("init_from"),
           "changes": differences(config, load_config(recipes()[recipe]).to_dict()),
           "val_curve": [{"epoch": r["epoch"], "CIDEr": round(r["CIDEr"], 4)} for r in curve],
           "best_epoch": max(curve, key=lambda r: r["CIDEr"])["epoch"], "decoded": {}}
    if sampled:
        row["last_epoch_samples"] = {key: round(sum(r[key] for r in sampled) / len(sampled), 4)
                                     for key in ("reward", "cut_share", "caption_length", "sample_entropy")}
    for name, decode in DECODINGS.items():
        scored = folder / f"val_{name}" / "scores_val.json"
        scores = json.loads(scored.read_text()) if scored.exists() else None
        if not scores or scores["decode"] != decode or scored.stat().st_mtime < (folder / "best.pt").stat().st_mtime:
            # not scored with this decoding since best.pt was written
            scores = evaluate_checkpoint(folder / "best.pt", "val", out_dir=scored.parent, progress=False,
                                         overrides=["data.max_val_images=null", *decode_overrides(decode)])
        diversity = scores["diversity"]
        row["decoded"][name] = {
            "images": scores["images"], **{k: round(scores[k], 4) for k in ("BLEU-4", "METEOR", "CIDEr")},
            "distinct_captions": round(diversity["distinct_captions"], 4),
            "vocabulary_used": diversity["vocabulary_used"], "mean_length": round(diversity["mean_length"], 2),
            "dangling_end": round(diversity["dangling_end"], 4),
            "repeated_bigram": round(diversity["repeated_bigram"], 4)}
        print(json.dumps({"run": folder.name, "decoding": name, **row["decoded"][name]}), flush=True)
    return row


def made_by(rows: list[dict]) -> tuple[list[str], list[str]]:
    """The configs and probes of the result: each row's recipe with the changes that shape its training (trained as
    it was), and the decoding probes of :data:`DECODINGS`."""
    configs = []
    for row in rows:
        changes = [c for c in row["changes"] if not c.startswith((*LENGTH_AND_START, "decode."))]
        configs.append(" ".join([row["recipe"], *changes]))
    configs = list(dict.fromkeys(configs))
    probes = ["text", "metrics", *(f"train {config}" for config in configs),
              *(" ".join(["decode", XE, *decode_overrides(decode)]) for decode in DECODINGS.values())]
    return configs, probes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="run folders (best.pt, config.yaml, metrics.jsonl)")
    parser.add_argument("--save", metavar="NAME", help="also write benchmarks/results/NAME.json")
    args = parser.parse_args()
    rows = [scored_run(Path(folder)) for folder in args.folders]
    if args.save:
        configs, probes = made_by(rows)
        write_result(args.save, {"runs": rows}, configs=configs, probes=probes)


if __name__ == "__main__":
    main()
