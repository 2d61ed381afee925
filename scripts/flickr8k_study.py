"""The paper's own benchmark: soft against hard against no attention (and the Transformer) on the full Flickr8k
(6,000 training and 1,000 validation photos of ``../shared/data/flickr8k``, VGG-19 conv5_4 features, 14 x 14 x 512),
beside Xu et al. (2015), Table 1.

Each run trains a shipped recipe (``flickr8k_full_soft``, ``flickr8k_full_hard``, ``flickr8k_full_transformer``),
or its no-attention ablation, with one seed; scores its best checkpoint on all 1,000 validation photos (beam and
decoding of the recipe): BLEU-1..4, METEOR, ROUGE-L, CIDEr, the words used, distinct captions, repeated bigrams,
attention entropy and peak; grounds its attention on ``../shared/data/coco-mini`` (80 COCO photos with their
instance masks: pointing, mass in the mask, against a uniform map and the image centre); and writes all of it, with
the machine and the training time (wall, and CPU seconds of all its threads, which other work on the machine
barely moves), into ``benchmarks/results/flickr8k_full.json`` beside the runs saved before (one entry per recipe,
ablation and seed), which the docs' results page renders as one table with the paper's rows. A study that spans
several sessions loses nothing: the JSON is committed, the checkpoints (research-only data) never are.

    python scripts/flickr8k_study.py soft --seed 0              # flickr8k_full_soft, seed 0
    python scripts/flickr8k_study.py soft --seed 0 --ablation   # its ablation (model.lstm.attention=none)
    python scripts/flickr8k_study.py hard --seed 1 -- train.epochs=2   # overrides after --: a trial, not saved
    python scripts/render_results.py                                 # the table on docs/results.md
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import (  # noqa: E402  (benchmarks/results.py: the machine block and the inputs' SHA-256)
    RESULTS_DIR,
    machine_block,
    stale_inputs,
    write_result,
)

from captioner.config import load_config, recipes  # noqa: E402

COCO_MINI = ROOT.parent / "shared" / "data" / "coco-mini"
RESULTS = "flickr8k_full"
RUNS = ROOT / "runs" / "flickr8k_full"
KINDS = {"soft": "flickr8k_full_soft", "hard": "flickr8k_full_hard", "transformer": "flickr8k_full_transformer"}
# the no-attention ablation of each recipe: the context is the mean of the regions at every word
ABLATION = {"soft": ["model.lstm.attention=none", "model.lstm.attention_mode=soft"],
            "hard": ["model.lstm.attention=none", "model.lstm.attention_mode=soft"],
            "transformer": ["model.transformer.memory=mean"]}
# the code a run's scores depend on, hashed beside its recipe: a change to any of them makes its JSON stale
CODE = ["captioner/models/lstm_decoder.py", "captioner/models/transformer_decoder.py", "captioner/models/attention.py",
        "captioner/training/losses.py", "captioner/training/engine.py", "captioner/decoding/search.py",
        "captioner/data/text.py", "captioner/data/vocabulary.py", "scripts/flickr8k_study.py"]
METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "METEOR", "ROUGE-L", "CIDEr")


def coco_mini_overrides(features: str) -> list[str]:
    """coco-mini as split ``test``: its official captions and instance masks, features cached beside the Flickr ones."""
    annotations = COCO_MINI / "annotations"
    return ["data.format=coco", f"data.captions={json.dumps({'test': str(annotations / 'captions_train2017.json')})}",
            f"data.images={json.dumps({'test': str(COCO_MINI / 'train2017')})}",
            f"data.instances={json.dumps({'test': str(annotations / 'instances_train2017.json')})}",
            f"data.features={json.dumps(features)}"]


def ensure_features(recipe: Path, features: str, overrides: list[str], splits: list[str]) -> None:
    """Cache the recipe's encoder's features once (the CLI's cache-features)."""
    if not (Path(features) / "meta.json").exists():
        subprocess.run([sys.executable, "-m", "captioner", "cache-features", str(recipe), *overrides,
                        f"data.features={features}", "--splits", *splits], check=True)


def run_name(kind: str, seed: int, ablation: bool) -> str:
    return f"{kind}{'_none' if ablation else ''}_s{seed}"


def run(kind: str, seed: int, ablation: bool, extra: list[str]) -> dict:
    """Train, score on all validation photos, ground on coco-mini; the result as saved (or, with ``extra``
    overrides, printed only: a trial is not the recipe)."""
    from captioner.commands.evaluate import evaluate_checkpoint
    from captioner.training.engine import train

    recipe = recipes()[KINDS[kind]]
    name = run_name(kind, seed, ablation)
    out = RUNS / (name if not extra else name + "_trial")
    overrides = [*(ABLATION[kind] if ablation else []), f"run.seed={seed}", f"run.out={out}", *extra]
    config = load_config(recipe, overrides)
    ensure_features(recipe, config.data.features, [], ["train", "val"])
    started, cpu_started = time.perf_counter(), time.process_time()
    trained = train(config, overwrite=True)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    checkpoint = trained["checkpoint"]
    val = evaluate_checkpoint(checkpoint, "val", out_dir=out, progress=False)
    coco = {}
    if COCO_MINI.exists() and not ablation:
        features = str(Path(config.data.features).with_name(Path(config.data.features).name + "_coco_mini"))
        ensure_features(recipe, features, coco_mini_overrides(features), ["test"])
        coco = evaluate_checkpoint(checkpoint, "test", out_dir=out / "coco_mini", progress=False,
                                   overrides=coco_mini_overrides(features))
    import torch
    progress = torch.load(Path(checkpoint).with_name("last.pt"), weights_only=True, map_location="cpu")["progress"]
    grounding = coco.get("grounding") or {}
    result = {"run": name, "recipe": KINDS[kind], "kind": kind, "ablation": ablation, "seed": seed,
              "overrides": overrides[:-1 - len(extra)] + extra if extra else overrides[:-1],
              "epochs": trained["epochs"], "best_val_metric": {config.train.metric: round(trained["best"], 4)},
              "precision": progress.get("amp"),
              "train_seconds": round(seconds, 1), "train_cpu_seconds": round(cpu_seconds, 1),
              "validation_images": val["images"],
              "val": {k: round(val[k], 4) for k in METRICS},
              "diversity": {k: round(v, 4) for k, v in val["diversity"].items()},
              "attention": {k: round((val.get("attention") or {}).get(k, float("nan")), 4)
                            for k in ("mean_entropy", "uniform_entropy", "peak_ratio")} if val.get("attention") else None,
              "coco_mini": {k: round(grounding[k], 4) for k in ("pointing_accuracy", "attention_inside",
                                                                "uniform_pointing", "uniform_inside", "centre_pointing")}
              | {"words": grounding["words"], "map": grounding["map"]} if grounding else None}
    if extra:
        print(json.dumps(result, indent=1))
    else:
        save(name, result, [*(f"captioner/configs/{r}.yaml" for r in KINDS.values()), *CODE])
    return result


def save(name: str, row: dict, inputs: list[str]) -> None:
    """Add ``row`` to the study's one result, ``benchmarks/results/flickr8k_full.json`` (its table:
    ``benchmarks/tables.py``), beside the runs saved before: each run keeps its own machine block. Runs measured
    with other versions of the recipes or the code cannot sit beside this one: they are named, and the study
    starts anew only with ``--restart``."""
    path = RESULTS_DIR / f"{RESULTS}.json"
    saved = json.loads(path.read_text()) if path.exists() else None
    kept = dict(saved["result"]["runs"]) if saved else {}
    if saved and stale_inputs(saved):
        raise SystemExit(f"{path}: its runs ({', '.join(kept)}) were measured with other versions of "
                         f"{', '.join(stale_inputs(saved))}; run them again with these (--restart drops them)")
    kept[name] = {**row, "machine": machine_block()}
    write_result(RESULTS, {"runs": dict(sorted(kept.items()))}, inputs=inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(KINDS), help="the recipe: flickr8k_full_KIND")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ablation", action="store_true", help="the recipe's no-attention ablation")
    parser.add_argument("--restart", action="store_true",
                        help="drop the saved runs measured with other versions of the recipes or the code")
    parser.add_argument("overrides", nargs="*", help="after --: overrides for a trial run (printed, not saved)")
    args = parser.parse_args()
    if args.restart:
        (RESULTS_DIR / f"{RESULTS}.json").unlink(missing_ok=True)
    run(args.kind, args.seed, args.ablation, args.overrides)


if __name__ == "__main__":
    main()
