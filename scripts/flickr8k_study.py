"""The paper's own benchmark: soft against hard against no attention (and the Transformer) on the full Flickr8k
(6,000 training and 1,000 validation photos of ``data/flickr8k``, the recipes' own data, which ``captioner data
flickr8k --root data/flickr8k`` makes; VGG-19 conv5_4 features, 14 x 14 x 512, but where a recipe names another
encoder), beside Xu et al. (2015), Table 1.

Each run trains a shipped recipe (``flickr8k_full_soft``, ``flickr8k_full_hard``, ``flickr8k_full_transformer``;
those that go on with self-critical training, ``flickr8k_full_soft_scst``, ``flickr8k_full_transformer_scst`` and
``flickr8k_full_soft_scst_lite2``, the soft one over EfficientNet-Lite2 features; ``flickr8k_full_soft_lite2``, the
last one's cross-entropy stage alone; ``flickr8k_full_marginal``, marginal attention; the three ``*_scst_words``
recipes, which fine-tune the output layer of the study's SCST run of the same seed: ``soft_scst_lite2_words`` that
of ``soft_scst_lite2``), or its no-attention ablation, with one seed; scores its best checkpoint (and an SCST run's
cross-entropy start, ``cross_entropy.pt``, the same way) on all 1,000 validation photos (beam and decoding of the
recipe): BLEU-1..4, METEOR, ROUGE-L, CIDEr, the words used, distinct captions, repeated bigrams,
attention entropy and peak; grounds its attention on coco-mini (``$CAPTIONER_COCO_MINI``, default
``data/coco-mini``: COCO photos with their instance masks, see ``scripts/coco_mini.py``: pointing, mass in the
mask, against a uniform map and the image centre); and writes all of it, with
the machine and the training time (wall, and CPU seconds of all its threads, which other work on the machine
barely moves), into ``benchmarks/results/flickr8k_full.json`` beside the runs saved before (one entry per recipe,
ablation and seed), which the docs' results page renders as one table with the paper's rows. A study that spans
several sessions loses nothing: the JSON is committed, the checkpoints (research-only data) never are.

    python scripts/flickr8k_study.py soft --seed 0              # flickr8k_full_soft, seed 0
    python scripts/flickr8k_study.py soft --seed 0 --ablation   # its ablation (model.lstm.attention=none)
    python scripts/flickr8k_study.py hard --seed 1 -- train.epochs=2   # overrides after --: a trial, not saved
    python scripts/flickr8k_study.py soft_scst --seed 0 --resume      # a run stopped (Ctrl-C) or killed: go on
    python scripts/flickr8k_study.py soft_scst_words --seed 0         # after soft_scst --seed 0: its words back
    python scripts/flickr8k_study.py soft --seed 0 --save flickr8k_trials --name cosine6 -- \
        train.lr_schedule=cosine train.epochs=6                      # a trial saved apart, in the result NAME
    python scripts/render_results.py                                 # the table on docs/results.md
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from coco_mini import COCO_MINI, coco_mini_features, coco_mini_overrides

from captioner.config import load_config, recipes
from captioner.core.console import LOG_FORMAT
from captioner.core.process import set_up_process
from captioner.data.feature_cache import cache_is_complete
from captioner.errors import CaptionerError
from captioner.evaluation.caption_metrics import METRICS
from captioner.results.fingerprint import ConfigRef, probe_name
from captioner.results.record import (RESULTS_DIR, add_entry, entries_made_otherwise, load_results,
                                      made_otherwise_message, why_stale)
from captioner.results.record import made_by as record_made_by
from captioner.workflows.report import read_metrics

ROOT = Path(__file__).resolve().parent.parent

RESULTS = "flickr8k_full"
RUNS = ROOT / "runs" / "flickr8k_full"
KINDS = {"soft": "flickr8k_full_soft", "hard": "flickr8k_full_hard", "transformer": "flickr8k_full_transformer",
         "soft_scst": "flickr8k_full_soft_scst", "transformer_scst": "flickr8k_full_transformer_scst",
         "soft_lite2": "flickr8k_full_soft_lite2", "soft_scst_lite2": "flickr8k_full_soft_scst_lite2",
         "marginal": "flickr8k_full_marginal", "soft_scst_words": "flickr8k_full_soft_scst_words",
         "soft_scst_lite2_words": "flickr8k_full_soft_scst_lite2_words",
         "transformer_scst_words": "flickr8k_full_transformer_scst_words"}
# a recipe that fine-tunes another's model: the study's run of that recipe with the same seed (its best.pt)
AFTER = {"soft_scst_words": "soft_scst", "soft_scst_lite2_words": "soft_scst_lite2",
         "transformer_scst_words": "transformer_scst"}
# the no-attention ablation of each recipe: the context is the mean of the regions at every word
ABLATION = {"soft": ["model.lstm.attention=none", "model.lstm.attention_mode=soft"],
            "hard": ["model.lstm.attention=none", "model.lstm.attention_mode=soft"],
            "transformer": ["model.transformer.memory=mean"]}


def made_by(kind: str, ablation: bool, extra: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """What made a run's numbers: its config (the recipe, or its ablation, with a trial's ``extra`` overrides) and
    the probes of the code it runs; for a run that fine-tunes another (``AFTER``), that run's config and probes too."""
    config = ConfigRef(KINDS[kind], (*(ABLATION[kind] if ablation else []), *extra))
    keys, probes = [config.key], ["text", "metrics", f"data {KINDS['soft']}", probe_name("train", config),
                                  probe_name("decode", config)]
    if kind in AFTER:
        before_keys, before_probes = made_by(AFTER[kind], False)
        keys, probes = [*keys, *before_keys], [*probes, *(p for p in before_probes if p not in probes)]
    return keys, probes


def ensure_features(recipe: Path, features: str, overrides: list[str], splits: list[str]) -> None:
    """Cache the recipe's encoder's features once (the CLI's cache-features), or finish a cache left unfinished."""
    if not cache_is_complete(features):
        subprocess.run([sys.executable, "-m", "captioner", "cache-features", str(recipe), *overrides,
                        f"data.features={features}", "--splits", *splits], check=True)


def run_name(kind: str, seed: int, ablation: bool) -> str:
    return f"{kind}{'_none' if ablation else ''}_s{seed}"


def validation_curve(run_dir: Path) -> list[dict]:
    """The run's validation score after each epoch (``metrics.jsonl``), as ``{"epoch", metric: value}``."""
    # the last of an epoch's: a run killed after validating an epoch and before saving it validates it again
    epochs = {r["epoch"]: r for r in read_metrics(run_dir) if r.get("type") == "val"}
    return [{"epoch": epoch, **{m: round(r[m], 4) for m in METRICS if m in r}} for epoch, r in epochs.items()]


def run(kind: str, seed: int, ablation: bool, extra: list[str], resume: bool = False, save: str | None = None,
        trial: str | None = None, restart: bool = False) -> dict:
    """Train (or, with ``resume``, go on from the run's ``last.pt``), score on all validation photos, ground on
    coco-mini; the result as saved. With ``extra`` overrides it is a trial, not the recipe: printed, or with ``save``
    saved as the entry ``trial`` of that result (made by the recipe with the overrides), in ``runs/flickr8k_full/``
    under that name. A run stopped before its end is not scored: it says how to go on. The study's runs saved before
    and made otherwise refuse it, or with ``restart`` are dropped."""
    from captioner.training.engine import train
    from captioner.workflows.evaluate import evaluate_checkpoint

    recipe = recipes()[KINDS[kind]]
    name = run_name(kind, seed, ablation)
    out = RUNS / (name if not extra else f"{name}_{trial or 'trial'}")
    after = run_name(AFTER[kind], seed, False) if kind in AFTER else None
    saved = (load_results().get(RESULTS) or {}).get("result", {}).get("runs", {}) if after else {}
    if after and (after not in saved or not (RUNS / after / "best.pt").exists()):
        raise SystemExit(f"{RUNS / after}: {KINDS[kind]} fine-tunes the best model of the study's "
                         f"{KINDS[AFTER[kind]]} run with seed {seed}, which is not "
                         f"{'on this machine' if after in saved else 'trained and saved yet'}: python "
                         f"scripts/flickr8k_study.py {AFTER[kind]} --seed {seed}")
    fine_tunes = [f"train.init_from={RUNS / after / 'best.pt'}"] if after else []     # recorded as "after"
    overrides = [*(ABLATION[kind] if ablation else []), f"run.seed={seed}", f"run.out={out}", *extra]
    config = load_config(recipe, [*fine_tunes, *overrides])
    keys, probes = made_by(kind, ablation, extra)
    made = record_made_by(keys, probes)       # the settings and probes that make its numbers, as it starts
    if not (save or restart) and (otherwise := entries_made_otherwise(RESULTS, "runs")):
        otherwise.pop(name, None)                                       # its own entry is replaced
        if otherwise:                                                   # refused now, not after hours of training
            raise SystemExit(f"{made_otherwise_message(RESULTS_DIR / f'{RESULTS}.json', otherwise)}; drop them "
                             f"with --restart where a recipe changed on purpose")
    ensure_features(recipe, config.data.features, [], ["train", "val"])
    started, cpu_started = time.perf_counter(), time.process_time()
    trained = train(config, resume=resume, overwrite=not resume)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    if trained["stopped"]:
        again = shlex.join([kind, "--seed", str(seed), *(["--ablation"] if ablation else []), "--resume",
                            *(["--save", save, "--name", trial] if save else []), *(["--", *extra] if extra else [])])
        raise SystemExit(f"{out}: stopped at epoch {trained['epochs']}; go on with: python scripts/flickr8k_study.py "
                         f"{again}")
    checkpoint = trained["checkpoint"]
    val = evaluate_checkpoint(checkpoint, "val", out_dir=out, progress=False)
    start = out / "cross_entropy.pt"        # an SCST recipe's cross-entropy start, scored the same way
    start_val = evaluate_checkpoint(start, "val", out_dir=out / "start", progress=False) if start.exists() else None
    coco = {}
    if COCO_MINI.exists() and not ablation:
        features = coco_mini_features(config.data.features)
        ensure_features(recipe, features, coco_mini_overrides(features), ["test"])
        coco = evaluate_checkpoint(checkpoint, "test", out_dir=out / "coco_mini", progress=False,
                                   overrides=coco_mini_overrides(features))
    import torch
    progress = torch.load(Path(checkpoint).with_name("last.pt"), weights_only=True, map_location="cpu")["progress"]
    grounding = coco.get("grounding") or {}
    result = {"run": name, "recipe": KINDS[kind], "kind": kind, "ablation": ablation, "seed": seed,
              **({"after": after} if after else {}),
              "overrides": overrides[:-1 - len(extra)] + extra if extra else overrides[:-1],
              "epochs": trained["epochs"], "best_val_metric": {config.train.metric: round(trained["best"], 4)},
              "val_curve": validation_curve(out),
              "precision": progress.get("precision"),
              # resumed: the wall time of all its parts (as the checkpoint keeps it); the CPU time of the last is no sum
              "train_seconds": round(trained["train_seconds"] if resume else seconds, 1),
              "train_cpu_seconds": None if resume else round(cpu_seconds, 1), "resumed": resume,
              "validation_images": val["images"],
              "val": {k: round(val[k], 4) for k in METRICS},
              "diversity": {k: round(v, 4) for k, v in val["diversity"].items()},
              "start": {"epochs": progress.get("scst_from"), "val": {k: round(start_val[k], 4) for k in METRICS},
                        "diversity": {k: round(v, 4) for k, v in start_val["diversity"].items()}}
              if start_val else None,
              "attention": {k: round((val.get("attention") or {}).get(k, float("nan")), 4)
                            for k in ("mean_entropy", "uniform_entropy", "peak_ratio")} if val.get("attention") else None,
              "coco_mini": {k: round(grounding[k], 4) for k in ("pointing_accuracy", "attention_inside",
                                                                "uniform_pointing", "uniform_inside", "centre_pointing")}
              | {"words": grounding["words"], "map": grounding["map"]} if grounding else None}
    if extra and not save:
        print(json.dumps(result, indent=1))
    else:
        # beside the runs saved before (its table: results.tables); the study's runs made otherwise refuse it
        # (--restart drops them), a trial's result drops them
        (out / "study_entry.json").write_text(json.dumps(result, indent=1))
        if changed := why_stale(made):
            raise SystemExit(f"{out}: what makes its numbers changed while it trained ({'; '.join(changed)}): they "
                             f"are in {out / 'study_entry.json'}, not saved; train it again")
        add_entry(save or RESULTS, "runs", f"{name}_{trial}" if save else name, result, configs=keys, probes=probes,
                  keep_stale=not (save or restart))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(KINDS), help="the recipe: flickr8k_full_KIND")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ablation", action="store_true", help="the recipe's no-attention ablation")
    parser.add_argument("--resume", action="store_true", help="go on with the run from its last.pt, then score it")
    parser.add_argument("--restart", action="store_true",
                        help="drop the saved runs made with other settings or another behaviour of the code (a "
                        "recipe changed on purpose); without it they refuse this run's entry")
    parser.add_argument("--save", metavar="NAME", help="save a trial as an entry of the result NAME (with --name)")
    parser.add_argument("--name", help="the trial's name: its run folder and entry, after the run's")
    parser.add_argument("overrides", nargs="*", help="after --: overrides for a trial run (printed, or with --save "
                                                     "saved apart from the study)")
    args = parser.parse_intermixed_args()     # options before the -- of the overrides (parse_args refuses them)
    if bool(args.save) != bool(args.name) or (args.save and not args.overrides):
        parser.error("--save and --name save a trial: give both, and its overrides after --")
    if args.save == RESULTS:
        parser.error(f"a trial is not the recipe: save it apart from {RESULTS}")
    if args.save and args.restart:
        parser.error("--restart drops the study's saved runs, not a trial's")
    if any(o.startswith(("run.seed=", "run.out=")) for o in args.overrides):
        parser.error("give a run's seed with --seed and a trial's folder with --name, not as overrides")
    if args.kind in AFTER and any(o.startswith("train.init_from=") for o in args.overrides):
        parser.error(f"{args.kind} fine-tunes the study's {AFTER[args.kind]} run of its seed: not another model")
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)   # each run's start-up facts: device, precision chosen
    if args.ablation and args.kind not in ABLATION:
        parser.error(f"{args.kind} has no ablation: one of {', '.join(sorted(ABLATION))}")
    try:
        run(args.kind, args.seed, args.ablation, args.overrides, args.resume, args.save, args.name, args.restart)
    except CaptionerError as err:
        raise SystemExit(str(err)) from None


if __name__ == "__main__":
    set_up_process()    # as every captioner command: its times are those of captioner train
    main()
