"""How long a shipped recipe takes, end to end, on the machine at hand: the time users are promised (the
``flickr8k_full_*`` recipes: at most 45 minutes on a 2-core CPU).

It trains the recipe as it ships (seed 0, its epochs and validations, ``amp: auto``) with every core this process
may use as torch threads, then scores the best checkpoint on the whole validation split (beam and decoding of the
recipe), and writes the wall time of each, with the machine, the load on it before the run started, the precision
chosen, the epochs and the validation CIDEr, into ``benchmarks/results/recipe_times.json`` beside the recipes and
machines timed before (one entry per recipe and device: a GPU by its name, a CPU by its model and widest vector
extension, so that timing a recipe on another CPU keeps the one timed before). The docs' results page renders it as
a table. Run it on an otherwise idle machine: a second job on the same cores would be timed too, and the entry's
``load_before`` says whether one was there.

    python scripts/recipe_time.py flickr8k_full_hard          # on the CPU, or on the GPU where there is one
    python scripts/render_results.py                          # the table on docs/results.md
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from captioner.config import load_config, recipes
from captioner.core.console import LOG_FORMAT
from captioner.core.process import set_up_process
from captioner.results.record import add_entry, machine_block
from captioner.results.tables import entry_key

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "recipe_times"
RUNS = ROOT / "runs" / "recipe_times"
RECIPES = sorted(n for n in recipes() if n.startswith("flickr8k_full_"))


def device_name() -> str:
    """The device a run trains on, as its entry is keyed: ``cpu`` or the GPU's name."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def time_recipe(name: str, overrides: list[str]) -> dict:
    """Train recipe ``name`` (seed 0) and score its best checkpoint on all validation photos; the timings."""
    import torch

    from captioner.core.devices import usable_cores
    from captioner.training.engine import train
    from captioner.workflows.evaluate import evaluate_checkpoint

    torch.set_num_threads(usable_cores())
    load_before = [round(x, 2) for x in os.getloadavg()]
    config = load_config(recipes()[name], [f"run.out={RUNS / name}", *overrides])
    started = time.perf_counter()
    trained = train(config, overwrite=True)
    train_seconds = time.perf_counter() - started
    started = time.perf_counter()
    val = evaluate_checkpoint(trained["checkpoint"], "val", out_dir=RUNS / name, progress=False)
    score_seconds = time.perf_counter() - started
    progress = torch.load(Path(trained["checkpoint"]).with_name("last.pt"), weights_only=True,
                          map_location="cpu")["progress"]
    return {"recipe": name, "device": device_name(), "overrides": overrides, "epochs": trained["epochs"],
            "precision": progress.get("precision"), "load_before": load_before,
            "train_seconds": round(train_seconds, 1), "score_seconds": round(score_seconds, 1),
            "validation_images": val["images"], "val_cider": round(val["CIDEr"], 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", choices=RECIPES)
    parser.add_argument("overrides", nargs="*", help="after --: overrides for a trial (printed, not saved)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)   # the start-up lines: device, precision chosen
    entry = time_recipe(args.recipe, args.overrides)
    print(entry)
    if not args.overrides:      # beside the entries of the other recipes and devices (its table: results.tables)
        add_entry(RESULTS, "entries", entry_key(entry, machine_block()), entry, configs=[args.recipe],
                  probes=[f"{probe} {args.recipe}" for probe in ("train", "decode")])


if __name__ == "__main__":
    set_up_process()    # as every captioner command: its times are those of captioner train
    main()
