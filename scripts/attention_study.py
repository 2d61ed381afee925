"""Why is attention flat on real photos, and what makes it attend? The study behind the README's
"Attention on real photos" section, reproducible with this script.

Each variant is the Flickr recipe as it was before the study (``configs/flickr8k_soft.yaml`` with ``BEFORE``:
VGG-19 conv5_4 14x14x512, cached, lambda 1 per caption) with
a few overrides, trained for the same number of epochs (``--epochs``, the 10-minute budget of a 2-core
CPU) on the 700 training photos of ``../shared/data/flickr8k-800``, then

* scored on its 100 validation photos (beam 3): BLEU-4, METEOR, CIDEr and the attention statistics of
  :mod:`captioner.evaluation.attention_stats` (entropy, peak as a multiple of uniform);
* grounded on ``../shared/data/coco-mini`` (80 COCO photos with the official instance masks): pointing
  accuracy of words naming COCO categories, against the uniform and centre baselines.

    python scripts/attention_study.py --variants baseline word --seeds 0      # two variants, seed 0
    python scripts/attention_study.py --table                                 # the table of what has run
    python scripts/attention_study.py --categories ln_word_0.05_s0            # coco-mini pointing per category

Results go to ``runs/attention_study/VARIANT_sSEED/`` and one line per run to
``runs/attention_study/results.jsonl``. Never commit them: they derive from research-only photos.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from captioner.config import load_config
from captioner.evaluation.evaluate import evaluate_checkpoint, ground_checkpoint
from captioner.training.engine import train

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "flickr8k_soft.yaml"
COCO_MINI = ROOT.parent / "shared" / "data" / "coco-mini"
OUT = ROOT / "runs" / "attention_study"
FEATURES = ROOT / "runs" / "features"

# The recipe before the study (lambda 1 per caption, tanh score, raw regions): every variant is these overrides on
# configs/flickr8k_soft.yaml, then its own. The recipe the study chose, today's config, is variant
# ln_word_0.02_bf16_smooth (run with --epochs 16: bf16 fits 16 epochs in the budget of 12 in float32).
BEFORE = ["loss.doubly_stochastic=1.0", "loss.doubly_stochastic_scale=caption", "model.lstm.region_norm=none",
          "train.amp=false", "loss.label_smoothing=0"]

def ln_word(weight: float, *more: str) -> list[str]:
    """LayerNorm over the regions and the doubly stochastic term per word with lambda ``weight``, then ``more``."""
    return ["loss.doubly_stochastic_scale=word", f"loss.doubly_stochastic={weight}", "model.lstm.region_norm=layer", *more]


# name -> (what it changes, overrides on the recipe before the study)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "baseline": ("the recipe before the study: lambda 1 per caption, tanh score, raw regions", []),
    "lambda0": ("no doubly stochastic term", ["loss.doubly_stochastic=0"]),
    "word": ("lambda 1 per word (the paper's balance)", ["loss.doubly_stochastic_scale=word"]),
    "relu": ("ReLU in the additive score", ["loss.doubly_stochastic_scale=caption", "model.lstm.score_activation=relu"]),
    "sharpness": ("learned inverse temperature", ["loss.doubly_stochastic_scale=caption", "model.lstm.learned_sharpness=true"]),
    "gate_none": ("no beta gate", ["loss.doubly_stochastic_scale=caption", "model.lstm.gate=none"]),
    "lr1e-3": ("learning rate 1e-3", ["loss.doubly_stochastic_scale=caption", "train.lr=0.001"]),
    "word_relu": ("per word + ReLU", ["loss.doubly_stochastic_scale=word", "model.lstm.score_activation=relu"]),
    "word_sharp": ("per word + learned sharpness",
                   ["loss.doubly_stochastic_scale=word", "model.lstm.learned_sharpness=true"]),
    "lambda0_sharp": ("no term + learned sharpness", ["loss.doubly_stochastic=0", "model.lstm.learned_sharpness=true"]),
    "grid7": ("7x7 regions (conv5_4 average-pooled), lambda 1 per caption",
              ["loss.doubly_stochastic_scale=caption", "encoder.grid=7", f"data.features={FEATURES}/flickr8k_vgg19_7x7"]),
    "word_grid7": ("7x7 regions, per word", ["loss.doubly_stochastic_scale=word", "encoder.grid=7",
                                              f"data.features={FEATURES}/flickr8k_vgg19_7x7"]),
    "layernorm": ("LayerNorm over each region's features", ["loss.doubly_stochastic_scale=caption",
                                                              "model.lstm.region_norm=layer"]),
    "layernorm_word": ("LayerNorm + lambda 1 per word", ["loss.doubly_stochastic_scale=word", "model.lstm.region_norm=layer"]),
    "layernorm_word_sharp": ("LayerNorm + per word + learned sharpness",
                             ["loss.doubly_stochastic_scale=word", "model.lstm.region_norm=layer",
                              "model.lstm.learned_sharpness=true"]),
    "layernorm_lambda0": ("LayerNorm, no doubly stochastic term", ["loss.doubly_stochastic=0", "model.lstm.region_norm=layer"]),
    "ln_relu_word_sharp": ("LayerNorm + ReLU + per word + learned sharpness",
                           ["loss.doubly_stochastic_scale=word", "model.lstm.region_norm=layer",
                            "model.lstm.score_activation=relu", "model.lstm.learned_sharpness=true"]),
    "ln_relu_lambda0_sharp": ("LayerNorm + ReLU + no term + learned sharpness",
                              ["loss.doubly_stochastic=0", "model.lstm.region_norm=layer",
                               "model.lstm.score_activation=relu", "model.lstm.learned_sharpness=true"]),
    "ln_word_0.2": ("LayerNorm + lambda 0.2 per word", ln_word(0.2)),
    "ln_word_0.05": ("LayerNorm + lambda 0.05 per word", ln_word(0.05)),
    "ln_word_0.05_sharp": ("LayerNorm + lambda 0.05 per word + learned sharpness",
                           ln_word(0.05, "model.lstm.learned_sharpness=true")),
    "ln_word_0.05_relu": ("LayerNorm + lambda 0.05 per word + ReLU", ln_word(0.05, "model.lstm.score_activation=relu")),
    "ln_word_0.05_bf16": ("LayerNorm + lambda 0.05 per word, bf16 autocast (more epochs in the budget)",
                          ln_word(0.05, "train.amp=true")),
    "ln_word_0.02_bf16": ("LayerNorm + lambda 0.02 per word, bf16 autocast", ln_word(0.02, "train.amp=true")),
    "ln_word_0.02_bf16_cosine": ("LayerNorm + lambda 0.02 per word, bf16 autocast, cosine learning rate",
                                 ln_word(0.02, "train.amp=true", "train.lr_schedule=cosine")),
    "ln_word_0.02_bf16_smooth": ("LayerNorm + lambda 0.02 per word, bf16 autocast, label smoothing 0.1",
                                 ln_word(0.02, "train.amp=true", "loss.label_smoothing=0.1")),
    "none_ln_bf16": ("no attention (mean of regions), LayerNorm, bf16: the ablation of the recipe",
                     ["model.lstm.attention=none", "loss.doubly_stochastic=0", "model.lstm.region_norm=layer",
                      "train.amp=true"]),
    "none_ln_bf16_smooth": ("no attention (mean of regions), LayerNorm, bf16, label smoothing 0.1: the ablation "
                            "of the recipe", ["model.lstm.attention=none", "loss.doubly_stochastic=0",
                                              "model.lstm.region_norm=layer", "train.amp=true", "loss.label_smoothing=0.1"]),
    "none": ("no attention (mean of regions): the ablation", ["model.lstm.attention=none", "loss.doubly_stochastic=0"]),
}


def coco_mini_overrides(features: str | None) -> list[str]:
    """Evaluation on coco-mini as split 'test' (official captions and instance files)."""
    annotations = COCO_MINI / "annotations"
    return ["data.format=coco", f"data.captions={json.dumps({'test': str(annotations / 'captions_train2017.json')})}",
            f"data.images={json.dumps({'test': str(COCO_MINI / 'train2017')})}",
            f"data.instances={json.dumps({'test': str(annotations / 'instances_train2017.json')})}",
            f"data.features={json.dumps(features)}"]


def grade_references(checkpoint: str, features: str, out: Path) -> dict:
    """Grounding on coco-mini of the attention while the model reads the 400 human captions."""
    return ground_checkpoint(checkpoint, "test", overrides=coco_mini_overrides(features), out_dir=out,
                             progress=False, references=True)


def ensure_cache(config: dict, folder: Path, overrides: list[str]) -> None:
    """Cache features with the CLI (once per encoder setting)."""
    if (folder / "meta.json").exists():
        return
    subprocess.run([sys.executable, "-m", "captioner", "cache-features", str(CONFIG), *overrides,
                    f"data.features={folder}", "--splits", *config], check=True)


def run_variant(name: str, seed: int, epochs: int, reuse: bool = False) -> dict:
    description, overrides = VARIANTS[name]
    out = OUT / f"{name}_s{seed}"
    config = load_config(CONFIG, [*BEFORE, *overrides, f"run.seed={seed}", f"train.epochs={epochs}", f"run.out={out}",
                                  "train.early_stopping=0", "train.wandb=disabled"])
    encoder_overrides = [o for o in overrides if o.startswith("encoder.")]
    ensure_cache(["train", "val"], Path(config.data.features), encoder_overrides)
    coco_features = str(Path(config.data.features).with_name(Path(config.data.features).name + "_coco_mini"))
    started = time.perf_counter()
    if reuse and (out / "best.pt").exists():   # trained before: score it again
        result = {"checkpoint": str(out / "best.pt"), "best": None}
        seconds = torch.load(out / "last.pt", weights_only=True)["progress"]["train_seconds"]
    else:
        result = train(config, overwrite=True)
        seconds = time.perf_counter() - started
    val = evaluate_checkpoint(result["checkpoint"], "val", beam_size=3, out_dir=out, progress=False)
    coco, references = {}, None
    if COCO_MINI.exists():
        ensure_coco_cache(coco_features, encoder_overrides)
        coco = evaluate_checkpoint(result["checkpoint"], "test", beam_size=3, out_dir=out / "coco_mini",
                                   overrides=coco_mini_overrides(coco_features), progress=False)
        references = grade_references(result["checkpoint"], coco_features, out / "coco_mini")
    row = {"variant": name, "seed": seed, "epochs": epochs, "description": description, "overrides": overrides,
           "train_seconds": round(seconds, 1), "best_epoch_metric": result["best"],
           "val": {k: val.get(k) for k in ("BLEU-1", "BLEU-4", "METEOR", "CIDEr")}, "val_attention": val.get("attention"),
           "coco_mini": {k: coco.get(k) for k in ("BLEU-4", "CIDEr")}, "coco_mini_attention": coco.get("attention"),
           "coco_mini_grounding": coco.get("grounding"), "coco_mini_reference_grounding": references}
    with (OUT / "results.jsonl").open("a") as handle:
        handle.write(json.dumps(row) + "\n")
    return row


def ensure_coco_cache(folder: str, encoder_overrides: list[str]) -> None:
    if (Path(folder) / "meta.json").exists():
        return
    subprocess.run([sys.executable, "-m", "captioner", "cache-features", str(CONFIG), *encoder_overrides,
                    *coco_mini_overrides(folder), "--splits", "test"], check=True)


def table(rows: list[dict]) -> str:
    def cell(value, digits=3):
        return "–" if value is None else f"{value:.{digits}f}"

    lines = ["| variant | seed | val CIDEr | val BLEU-4 | val METEOR | entropy (uniform 5.28) | peak / uniform | "
             "coco-mini pointing, own captions (words) | on the references (words) | uniform | centre | train s |",
             "|" + "---|" * 12]
    for r in rows:
        a, g, h = r.get("val_attention") or {}, r.get("coco_mini_grounding") or {}, r.get("coco_mini_reference_grounding") or {}
        lines.append(f"| {r['variant']} | {r['seed']} | {cell(r['val']['CIDEr'])} | {cell(r['val']['BLEU-4'])} | "
                     f"{cell(r['val']['METEOR'])} | {cell(a.get('mean_entropy'), 2)} | {cell(a.get('peak_ratio'), 1)} | "
                     f"{cell(g.get('pointing_accuracy'))} ({g.get('words', '–')}) | "
                     f"{cell(h.get('pointing_accuracy'))} ({h.get('words', '–')}) | {cell(h.get('uniform_pointing'))} | "
                     f"{cell(h.get('centre_pointing'))} | {r['train_seconds']:.0f} |")
    return "\n".join(lines)


def category_table(rows: list[dict], run: str) -> str:
    """Pointing accuracy on coco-mini per COCO category of one run (``VARIANT_sSEED``), with word counts, on its
    own captions and on the human references it reads, beside the uniform and centre baselines."""
    row = next((r for r in reversed(rows) if f"{r['variant']}_s{r['seed']}" == run), None)   # its latest run
    if row is None:
        raise SystemExit(f"{OUT / 'results.jsonl'}: no run {run}")
    own = (row.get("coco_mini_grounding") or {}).get("per_category", {})
    read = (row.get("coco_mini_reference_grounding") or {}).get("per_category", {})
    lines = ["| category | own captions: words | pointing | references: words | pointing | uniform | centre |",
             "|" + "---|" * 7]

    def cell(scores: dict, key: str) -> str:
        return f"{scores[key]:.2f}" if key in scores else "–"

    for name in sorted(set(own) | set(read), key=lambda n: -read.get(n, {}).get("words", 0)):
        o, r = own.get(name, {}), read.get(name, {})
        lines.append(f"| {name} | {o.get('words', 0)} | {cell(o, 'pointing_accuracy')} | {r.get('words', 0)} | "
                     f"{cell(r, 'pointing_accuracy')} | {cell(r or o, 'uniform_pointing')} | {cell(r or o, 'centre_pointing')} |")
    return "\n".join(lines)


def grade_missing(rows: list[dict]) -> list[dict]:
    """Add the reference grounding to the rows of runs made before it was measured."""
    for row in rows:
        checkpoint = OUT / f"{row['variant']}_s{row['seed']}" / "best.pt"
        if row.get("coco_mini_reference_grounding") is None and checkpoint.exists() and COCO_MINI.exists():
            overrides = VARIANTS[row["variant"]][1]
            features = [o.split("=", 1)[1] for o in overrides if o.startswith("data.features=")]
            base = Path(features[0]) if features else FEATURES / "flickr8k_vgg19"
            row["coco_mini_reference_grounding"] = grade_references(
                str(checkpoint), str(base.with_name(base.name + "_coco_mini")), checkpoint.parent / "coco_mini")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["baseline"], choices=sorted(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epochs", type=int, default=12, help="the budget: epochs that take ~10 min on 2 cores")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reuse", action="store_true", help="score a variant's existing checkpoint instead of training")
    parser.add_argument("--table", action="store_true", help="print the table of results.jsonl and stop")
    parser.add_argument("--categories", metavar="VARIANT_sSEED", help="print one run's coco-mini pointing per "
                        "category and stop")
    parser.add_argument("--grade", action="store_true", help="with --table: first add the reference grounding to "
                        "the runs that lack it (rewrites results.jsonl)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if not args.table and not args.categories:
        torch.set_num_threads(args.threads)
        for seed in args.seeds:
            for name in args.variants:
                row = run_variant(name, seed, args.epochs, reuse=args.reuse)
                print(json.dumps(row["val"]), json.dumps(row["val_attention"]), flush=True)
    results = OUT / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    if args.grade:
        rows = grade_missing(rows)
        results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(category_table(rows, args.categories) if args.categories else table(rows))


if __name__ == "__main__":
    main()
