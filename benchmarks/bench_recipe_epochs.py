"""A shipped Flickr8k recipe's epochs timed at the full Flickr8k's sizes without its photos, printed as JSON: how
long the recipe takes on a machine the research data cannot reach (a lent GPU machine), or before it is there.

The stand-in data has the full Flickr8k's shape: 6,000 training and 1,000 validation images of synthetic features in
the recipe's encoder's shape (written as the recipe's feature cache), five captions per image of 8-16 words drawn
uniformly from a vocabulary as large as the recipe's on Flickr8k. The engine trains the recipe on it as ``captioner
train`` does (its batch sizes, precision ``amp: auto``, validation on ``train.val_max_images`` images with its beam)
for ``--xe-epochs`` epochs of cross-entropy and, for an SCST recipe, ``--scst-epochs`` of self-critical training,
with early stopping off, on every core by default; each epoch's training and validation seconds come from the
run's ``metrics.jsonl``. The recipe's time for ``--project XE SCST`` epochs of each kind (default: the most the
recipe allows) is projected from the last measured epoch of each kind plus the run's other time (set-up, checkpoints,
the switch to SCST), counted once; caching the real photos' features and scoring the best checkpoint, which
``scripts/recipe_time.py`` includes, are not. A model trained on random captions never learns to end one, so its
samples and validation captions run to the length limit: the SCST and validation times are upper bounds. The entry,
keyed by recipe and device (a GPU by name, a CPU by model and widest vector extension), joins those measured before
in ``benchmarks/results/recipe_epochs.json``; ``--quick`` and other ``--images`` print theirs without saving it.

    python benchmarks/bench_recipe_epochs.py flickr8k_full_transformer_scst --device cuda
    python benchmarks/bench_recipe_epochs.py flickr8k_full_soft_scst_lite2 --xe-epochs 1 --scst-epochs 1 \\
        --project 6 8 --threads 2
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import CAPTION_WORDS, add_arguments, setup, stand_in_flickr8k

from captioner.checkpoint import load_checkpoint
from captioner.config import apply_overrides, load_config, recipes
from captioner.core.devices import usable_cores
from captioner.data.vocabulary import Vocabulary
from captioner.results.record import add_entry, machine_block
from captioner.results.tables import entry_key
from captioner.training.engine import train
from captioner.workflows.report import read_metrics

RECIPES = sorted(n for n in recipes() if n.startswith("flickr8k_full_") and not load_config(n).train.init_from)
IMAGES = {"train": 6000, "val": 1000}
def epoch_times(run_dir: Path, scst_from: int | None) -> dict[str, list[dict]]:
    """Each epoch's training and validation seconds from the run's ``metrics.jsonl``, by objective (the epochs after
    ``scst_from`` are self-critical)."""
    times: dict[str, list[dict]] = {"xe": [], "scst": []}
    for record in read_metrics(run_dir):
        if record["type"] == "val":
            objective = "scst" if scst_from is not None and record["epoch"] > scst_from else "xe"
            times[objective].append({"epoch": record["epoch"], "train_s": round(record["epoch_seconds"], 1),
                                     "val_s": round(record["val_seconds"], 1)})
    return {k: v for k, v in times.items() if v}


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", choices=RECIPES)
    parser.add_argument("--xe-epochs", type=positive, default=1, help="cross-entropy epochs to time (default 1)")
    parser.add_argument("--scst-epochs", type=positive, default=1,
                        help="an SCST recipe's self-critical epochs to time (default 1)")
    parser.add_argument("--project", type=int, nargs=2, metavar=("XE", "SCST"),
                        help="epochs of each kind to project the recipe's time for (default: its most)")
    parser.add_argument("--images", type=int, nargs=2, metavar=("TRAIN", "VAL"), default=list(IMAGES.values()),
                        help="stand-in images per split (default: Flickr8k's 6,000 and 1,000; other sizes are "
                        "printed, not saved)")
    add_arguments(parser)
    parser.set_defaults(threads=usable_cores())
    args = parser.parse_args()
    device = setup(args)
    config = load_config(recipes()[args.recipe])
    scst = config.train.objective == "scst"
    most = (config.train.scst_after_epoch, config.train.epochs - config.train.scst_after_epoch) if scst else (
        config.train.epochs, 0)
    project = args.project or most
    xe_epochs, scst_epochs = args.xe_epochs, args.scst_epochs if scst else 0
    images = dict(zip(IMAGES, [n // 10 for n in IMAGES.values()] if args.quick else args.images, strict=True))
    generator = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        overrides = stand_in_flickr8k(folder, config, images, generator) + [
            f"run.out={folder / 'run'}", f"run.device={device}", f"train.epochs={xe_epochs + scst_epochs}",
            "train.early_stopping=0", "train.wandb=disabled"]
        if scst:
            overrides += [f"train.scst_after_epoch={xe_epochs}", "train.scst_patience=null"]   # early stopping's: off
        started = time.perf_counter()
        trained = train(apply_overrides(config, overrides), progress=False)
        if trained["stopped"]:
            raise SystemExit(f"{args.recipe}: stopped before its {xe_epochs + scst_epochs} epochs ended; nothing saved")
        wall = time.perf_counter() - started
        times = epoch_times(folder / "run", xe_epochs if scst else None)
        last = load_checkpoint(folder / "run" / "last.pt")
        vocab, amp = len(Vocabulary.from_dict(last["vocab"])), last["progress"].get("precision")
    epochs_s = sum(e["train_s"] + e["val_s"] for kind in times.values() for e in kind)
    per_epoch = {kind: e[-1]["train_s"] + e[-1]["val_s"] for kind, e in times.items()}
    other = max(wall - epochs_s, 0.0)        # outside the epochs: set-up, checkpoints, the switch to SCST
    projected = other + project[0] * per_epoch["xe"] + project[1] * per_epoch.get("scst", 0.0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    entry = {"recipe": args.recipe, "device": name, "threads": torch.get_num_threads(), "precision": amp,
             "images": images, "caption_words": list(CAPTION_WORDS), "vocabulary": vocab, "epochs": times,
             "wall_s": round(wall, 1), "other_s": round(other, 1), "projected_epochs": list(project),
             "projected_min": round(projected / 60, 1), "trained_epochs": trained["epochs"]}
    print(json.dumps(entry, indent=2))
    if images != IMAGES:        # a trial at other sizes: printed, not saved
        return
    add_entry("recipe_epochs", "entries", entry_key(entry, machine_block()), entry, configs=[args.recipe],
              probes=[f"{probe} {args.recipe}" for probe in ("train", "decode")])


if __name__ == "__main__":
    main()
