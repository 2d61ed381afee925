"""Why is attention flat on real photos, and what makes it attend? And what makes the Transformer decoder as good
as the LSTM on them? The two studies behind the Flickr recipes (their history: CHANGELOG.md), reproducible with this script.

Each variant is the Flickr recipe as it was before the study (``configs/flickr8k_soft.yaml`` with ``BEFORE``:
VGG-19 conv5_4 14x14x512, cached, lambda 1 per caption) with
a few overrides, trained for the same number of epochs (``--epochs``, the 10-minute budget of a 2-core
CPU) on the recipe's 700 training photos (the first 700 of ``data/flickr8k``, which ``captioner data flickr8k --root
data/flickr8k`` makes; the study itself ran on an earlier 800-photo development subset, other photos), then

* scored on its 100 validation photos (beam 3): BLEU-4, METEOR, CIDEr and the attention statistics of
  :mod:`captioner.evaluation.attention_stats` (entropy, peak as a multiple of uniform);
* grounded on coco-mini (``$CAPTIONER_COCO_MINI``, default ``data/coco-mini``: COCO photos with the official
  instance masks, see ``scripts/coco_mini.py``): pointing accuracy of words naming COCO categories, against the
  uniform and centre baselines.

    python scripts/attention_study.py --variants baseline word --seeds 0      # two variants, seed 0
    python scripts/attention_study.py --table                                 # the table of what has run
    python scripts/attention_study.py --categories ln_word_0.05_s0            # coco-mini pointing per category

The Transformer study (:data:`TRANSFORMER_VARIANTS`) starts from the ``flickr8k_transformer`` recipe as it ships
instead, and ``soft`` / ``transformer`` are the two recipes as they ship, for comparing them at the same budget
(each variant's ``--epochs`` overrides its recipe's; without it, the recipe's own epochs)::

    python scripts/attention_study.py --variants soft transformer --seeds 0 1 2
    python scripts/attention_study.py --blocking soft_s0 transformer_s0     # CIDEr with and without blocking
    python scripts/attention_study.py --layers transformer_s0               # coco-mini pointing by layer, and of their mean

Results go to ``runs/attention_study/VARIANT_sSEED/`` and one line per run to
``runs/attention_study/results.jsonl``. Never commit them: they derive from research-only photos.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import torch
from coco_mini import COCO_MINI, coco_mini_features, coco_mini_overrides

from captioner.config import load_config, recipes
from captioner.core.console import LOG_FORMAT
from captioner.core.process import set_up_process
from captioner.training.engine import train
from captioner.workflows.evaluate import evaluate_checkpoint
from captioner.workflows.ground import ground_checkpoint

ROOT = Path(__file__).resolve().parent.parent
CONFIG = recipes()["flickr8k_soft"]
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


# The shipped recipes, and the Transformer study: name -> (what it changes, overrides on the draft). The draft is
# flickr8k_transformer with TRANSFORMER_DRAFT (2 layers, alpha from the last layer, trigram blocking, 16 epochs);
# the levers were run on it with --epochs 32.
RECIPES = {"soft": ("the soft-attention recipe as it ships (flickr8k_soft)", "flickr8k_soft"),
           "transformer": ("the Transformer recipe as it ships (flickr8k_transformer)", "flickr8k_transformer")}
TRANSFORMER_DRAFT = ["model.transformer.num_layers=2", "model.transformer.attention_layer=-1", "decode.block_ngram=3",
                     "train.epochs=16"]
TRANSFORMER_VARIANTS: dict[str, tuple[str, list[str]]] = {
    "tf_draft": ("the draft recipe: 2 layers, alpha from the last layer, trigram blocking", []),
    "tf_coco_sizes": ("the COCO recipe's sizes: d_model 512, 3 layers, 8 heads, FFN 2048, dropout 0.1",
                      ["model.transformer.d_model=512", "model.transformer.num_layers=3", "model.transformer.num_heads=8",
                       "model.transformer.ffn_dim=2048", "model.transformer.dropout=0.1"]),
    "tf_d512": ("d_model 512, 8 heads, FFN 2048 (2 layers)", ["model.transformer.d_model=512",
                "model.transformer.num_heads=8", "model.transformer.ffn_dim=2048"]),
    "tf_layers3": ("3 layers", ["model.transformer.num_layers=3"]),
    "tf_dropout0.1": ("dropout 0.1", ["model.transformer.dropout=0.1"]),
    "tf_dropout0.5": ("dropout 0.5", ["model.transformer.dropout=0.5"]),
    "tf_region_norm": ("LayerNorm over each region's VGG features before the projection, as the LSTM recipe",
                       ["model.transformer.region_norm=layer"]),
    "tf_layers3_region_norm": ("3 layers, and LayerNorm over the VGG features", ["model.transformer.num_layers=3",
                               "model.transformer.region_norm=layer"]),
    "tf_layers4": ("4 layers", ["model.transformer.num_layers=4"]),
}


def base_of(name: str) -> tuple[Path, list[str]]:
    """The config a variant starts from and the overrides that come before its own."""
    if name in RECIPES:
        return recipes()[RECIPES[name][1]], []
    if name in TRANSFORMER_VARIANTS:
        return recipes()["flickr8k_transformer"], TRANSFORMER_DRAFT
    return CONFIG, BEFORE


def described(name: str) -> tuple[str, list[str]]:
    if name in RECIPES:
        return RECIPES[name][0], []
    return (TRANSFORMER_VARIANTS | VARIANTS)[name]


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


def run_variant(name: str, seed: int, epochs: int | None, reuse: bool = False) -> dict:
    description, overrides = described(name)
    base, before = base_of(name)
    out = OUT / (f"{name}_s{seed}" + (f"_e{epochs}" if epochs else ""))      # --epochs: a run of its own
    config = load_config(base, [*before, *overrides, f"run.seed={seed}", f"run.out={out}", "train.early_stopping=0",
                                "train.wandb=disabled", *([f"train.epochs={epochs}"] if epochs else [])])
    epochs = config.train.epochs
    encoder_overrides = [o for o in overrides if o.startswith("encoder.")]
    ensure_cache(["train", "val"], Path(config.data.features), encoder_overrides)
    coco_features = coco_mini_features(config.data.features)
    started = time.perf_counter()
    if reuse and (out / "best.pt").exists():   # trained before: score it again
        result = {"checkpoint": str(out / "best.pt"), "best": None}
        seconds = torch.load(out / "last.pt", weights_only=True)["progress"]["train_seconds"]
    else:
        result = train(config, overwrite=True)
        seconds = time.perf_counter() - started
    val = evaluate_checkpoint(result["checkpoint"], "val", beam=3, out_dir=out, progress=False)
    coco, references = {}, None
    if COCO_MINI.exists():
        ensure_coco_cache(coco_features, encoder_overrides)
        coco = evaluate_checkpoint(result["checkpoint"], "test", beam=3, out_dir=out / "coco_mini",
                                   overrides=coco_mini_overrides(coco_features), progress=False)
        references = grade_references(result["checkpoint"], coco_features, out / "coco_mini")
    row = {"variant": name, "seed": seed, "epochs": epochs, "run": out.name, "description": description, "overrides": overrides,
           "train_seconds": round(seconds, 1), "best_epoch_metric": result["best"],
           "val": {k: val.get(k) for k in ("BLEU-1", "BLEU-4", "METEOR", "CIDEr")}, "val_attention": val.get("attention"),
           "val_diversity": val.get("diversity"),
           "precision": torch.load(out / "last.pt", weights_only=True)["progress"]["precision"],
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


def run_name(row: dict) -> str:
    """The folder of a row's run (rows written before ``run`` was recorded: ``VARIANT_sSEED``)."""
    return row.get("run") or f"{row['variant']}_s{row['seed']}"


def table(rows: list[dict]) -> str:
    def cell(value, digits=3):
        return "–" if value is None else f"{value:.{digits}f}"

    lines = ["| variant | seed | epochs | val CIDEr | val BLEU-4 | val METEOR | repeated bigram | dangling end | "
             "entropy (uniform 5.28) | peak / uniform | coco-mini pointing, own captions (words) | on the references "
             "(words) | uniform | centre | train s |", "|" + "---|" * 15]
    for r in rows:
        a, g, h = r.get("val_attention") or {}, r.get("coco_mini_grounding") or {}, r.get("coco_mini_reference_grounding") or {}
        d = r.get("val_diversity") or {}
        lines.append(f"| {r['variant']} | {r['seed']} | {r['epochs']} | {cell(r['val']['CIDEr'])} | "
                     f"{cell(r['val']['BLEU-4'])} | {cell(r['val']['METEOR'])} | {cell(d.get('repeated_bigram'), 2)} | "
                     f"{cell(d.get('dangling_end'), 2)} | {cell(a.get('mean_entropy'), 2)} | {cell(a.get('peak_ratio'), 1)} | "
                     f"{cell(g.get('pointing_accuracy'))} ({g.get('words', '–')}) | "
                     f"{cell(h.get('pointing_accuracy'))} ({h.get('words', '–')}) | {cell(h.get('uniform_pointing'))} | "
                     f"{cell(h.get('centre_pointing'))} | {r['train_seconds']:.0f} |")
    return "\n".join(lines)


def category_table(rows: list[dict], run: str) -> str:
    """Pointing accuracy on coco-mini per COCO category of one run (``VARIANT_sSEED``), with word counts, on its
    own captions and on the human references it reads, beside the uniform and centre baselines."""
    row = next((r for r in reversed(rows) if run_name(r) == run), None)   # its latest run
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
        checkpoint = OUT / run_name(row) / "best.pt"
        if row.get("coco_mini_reference_grounding") is None and checkpoint.exists() and COCO_MINI.exists():
            overrides = described(row["variant"])[1]
            features = [o.split("=", 1)[1] for o in overrides if o.startswith("data.features=")]
            base = Path(features[0]) if features else FEATURES / "flickr8k_vgg19"
            row["coco_mini_reference_grounding"] = grade_references(
                str(checkpoint), coco_mini_features(base), checkpoint.parent / "coco_mini")
    return rows


# Decoding settings compared by --blocking: name -> decode overrides (every other decode setting the run's own).
DECODINGS = {"no blocking": ["decode.block_ngram=0", "decode.no_dangling_end=false"],
             "block_ngram 2": ["decode.block_ngram=2", "decode.no_dangling_end=false"],
             "block_ngram 3": ["decode.block_ngram=3", "decode.no_dangling_end=false"],
             "block_ngram 2, no_dangling_end": ["decode.block_ngram=2", "decode.no_dangling_end=true"]}


def blocking_sweep(runs: list[str], decodings: list[str]) -> str:
    """Each run's best checkpoint decoded on the validation photos (beam 3) with each of ``decodings`` (names in
    :data:`DECODINGS`): does blocking repeated n-grams or dangling ends cost CIDEr? One line per decoding to
    ``blocking.jsonl``, and a table."""
    lines = ["| run | decoding | val CIDEr | val BLEU-4 | repeated bigram | dangling end | mean length |",
             "|" + "---|" * 7]
    for run in runs:
        checkpoint = OUT / run / "best.pt"
        if not checkpoint.exists():
            raise SystemExit(f"{checkpoint}: no such checkpoint (train the run first)")
        for name in decodings:
            scores = evaluate_checkpoint(checkpoint, "val", beam=3, out_dir=OUT / run / name.replace(" ", "_"),
                                         overrides=DECODINGS[name], progress=False)
            d = scores["diversity"]
            with (OUT / "blocking.jsonl").open("a") as handle:
                handle.write(json.dumps({"run": run, "decoding": name, "CIDEr": scores["CIDEr"],
                                         "BLEU-4": scores["BLEU-4"], "diversity": d}) + "\n")
            lines.append(f"| {run} | {name} | {scores['CIDEr']:.3f} | {scores['BLEU-4']:.3f} | "
                         f"{d['repeated_bigram']:.2f} | {d['dangling_end']:.2f} | {d['mean_length']:.1f} |")
    return "\n".join(lines)


def grounding_by_layer(run: str, maps: list[str] | None = None) -> str:
    """coco-mini pointing of a Transformer run's cross-attention (mean over heads) layer by layer, and averaged
    over the layers (``mean``), or only the ``maps`` named (layer numbers, ``mean``): on its own captions and
    reading the references, beside the centre and uniform baselines."""
    checkpoint = OUT / run / "best.pt"
    if not checkpoint.exists():
        raise SystemExit(f"{checkpoint}: no such checkpoint (train the run first)")
    config = torch.load(checkpoint, map_location="cpu", weights_only=True)["config"]
    layers, features = config["model"]["transformer"]["num_layers"], coco_mini_features(config["data"]["features"])
    lines = ["| cross-attention | own captions: pointing (words) | centre | reading the references: pointing (words) | "
             "centre | uniform |", "|" + "---|" * 6]
    for shown in maps or [*map(str, range(layers)), "mean"]:
        chosen = (["model.transformer.attention_map=mean"] if shown == "mean" else
                  ["model.transformer.attention_map=layer", f"model.transformer.attention_layer={shown}"])
        overrides = [*coco_mini_overrides(features), *chosen]
        out = OUT / run / f"coco_mini_map_{shown}"
        own = evaluate_checkpoint(checkpoint, "test", beam=3, out_dir=out, overrides=overrides,
                                  progress=False)["grounding"]
        read = ground_checkpoint(checkpoint, "test", overrides=overrides, out_dir=out, progress=False, references=True)
        lines.append(f"| {'mean of the layers' if shown == 'mean' else f'layer {shown}'} | "
                     f"{own['pointing_accuracy']:.3f} ({own['words']}) | {own['centre_pointing']:.3f} | "
                     f"{read['pointing_accuracy']:.3f} ({read['words']}) | {read['centre_pointing']:.3f} | "
                     f"{read['uniform_pointing']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=["baseline"],
                        choices=sorted([*VARIANTS, *TRANSFORMER_VARIANTS, *RECIPES]))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epochs", type=int, default=None, help="the budget (default: the recipe's train.epochs; the "
                        "attention study ran 12, ~10 min on 2 cores)")
    parser.add_argument("--only", nargs="+", metavar="VARIANT", help="with --table: only these variants' rows")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reuse", action="store_true", help="score a variant's existing checkpoint instead of training")
    parser.add_argument("--table", action="store_true", help="print the table of results.jsonl and stop")
    parser.add_argument("--categories", metavar="RUN", help="print one run's coco-mini pointing per category and "
                        "stop (RUN: its folder's name, VARIANT_sSEED[_eEPOCHS])")
    parser.add_argument("--blocking", nargs="+", metavar="RUN", help="decode these runs' best checkpoints with "
                        "each of --decodings, print the table and stop")
    parser.add_argument("--decodings", nargs="+", choices=list(DECODINGS), default=list(DECODINGS),
                        help="with --blocking: the decodings compared (default: all)")
    parser.add_argument("--layers", nargs="+", metavar=("RUN", "MAP"), help="a Transformer run's coco-mini pointing "
                        "by cross-attention layer and averaged over them (or only the MAPs named: layer numbers, mean); "
                        "print the table and stop")
    parser.add_argument("--grade", action="store_true", help="with --table: first add the reference grounding to "
                        "the runs that lack it (rewrites results.jsonl)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)     # each run's start-up facts (precision, ...)
    OUT.mkdir(parents=True, exist_ok=True)
    if args.blocking:
        torch.set_num_threads(args.threads)
        print(blocking_sweep(args.blocking, args.decodings))
        return
    if args.layers:
        torch.set_num_threads(args.threads)
        print(grounding_by_layer(args.layers[0], args.layers[1:]))
        return
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
    if args.only:
        rows = [row for row in rows if row["variant"] in args.only]
    print(category_table(rows, args.categories) if args.categories else table(rows))


if __name__ == "__main__":
    set_up_process()    # as every captioner command: its times are those of captioner train
    main()
