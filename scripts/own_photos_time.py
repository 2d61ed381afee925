"""The README's "Your own photos" commands as a user runs them, each timed: in an empty folder and a fresh shell
(``bash -c``, the clone's ``.venv/bin`` first on ``PATH``), Flickr8k is prepared, ``flickr8k_full_soft_lite2``
trains (caching the encoder's features of every photo first), its best checkpoint scores the test photos (the val
photos where the split has none) and captions the photos given as one's own:

    captioner data flickr8k --root data/flickr8k --from SOURCE      # in place of the 1.1 GB download
    captioner train flickr8k_full_soft_lite2 train.epochs=E
    captioner evaluate --checkpoint runs/flickr8k_full_soft_lite2/best.pt --split test
    captioner caption my_photos/*.jpg --checkpoint runs/flickr8k_full_soft_lite2/best.pt

It prints the transcript (each command, the end of its output, its exit status and wall time) and writes the times
into ``benchmarks/results/own_photos.json`` with the machine (the command recorded with the two folders named by
their role, ``FLICKR8K PHOTOS``: they are the runner's own), which the README renders as a table: the training's
time per epoch, so that the recipe's own epochs can be read off it (the first command's download is not timed: no
network here). Run it on an otherwise idle machine; never commit what it writes under its folder (the photos are for
research use only).

    python scripts/own_photos_time.py ~/datasets/flickr8k ~/Pictures --epochs 1      # FLICKR8K PHOTOS
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from captioner.results.record import write_result

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "own_photos"
RECIPE = "flickr8k_full_soft_lite2"
CHECKPOINT = f"runs/{RECIPE}/best.pt"
SHOWN_LINES = 12        # the last lines of each command's output in the transcript


def shell(command: str, folder: Path) -> dict:
    """Run ``command`` in a fresh ``bash`` in ``folder``; its exit status, wall seconds and output."""
    env = {"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
           "LANG": "C.UTF-8"}
    started = time.perf_counter()
    done = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    output = (done.stdout + done.stderr).rstrip("\n").splitlines()
    print(f"$ {command}", *output[-SHOWN_LINES:], f"[exit {done.returncode}, {seconds:.0f} s]", "", sep="\n",
          flush=True)
    return {"command": command, "exit": done.returncode, "seconds": round(seconds, 1), "output": output}


def run_steps(source: Path, photos: list[Path], folder: Path, epochs: int) -> dict:
    """The README's commands in ``folder``, each timed (see the module docstring); the entry of the result."""
    mine = folder / "my_photos"
    mine.mkdir(parents=True)
    for photo in photos:
        shutil.copy(photo, mine / photo.name)
    prepare = shell(f"captioner data flickr8k --root data/flickr8k --from {shlex.quote(str(source))}", folder)
    counts = json.loads((folder / "data" / "flickr8k" / "flickr8k_setup.json").read_text())["counts"]
    split = "test" if counts["test"]["images"] else "val"
    train = shell(f"captioner train {RECIPE} train.epochs={epochs}", folder)
    import torch

    progress = torch.load(folder / "runs" / RECIPE / "last.pt", weights_only=True, map_location="cpu")["progress"]
    evaluate = shell(f"captioner evaluate --checkpoint {CHECKPOINT} --split {split}", folder)
    caption = shell(f"captioner caption my_photos/*.jpg --checkpoint {CHECKPOINT}", folder)
    steps = [prepare, train, evaluate, caption]
    cached = sum(c["images"] for c in counts.values())
    from captioner.config import load_config, recipes

    config = load_config(recipes()[RECIPE])
    return {"recipe": RECIPE, "encoder": config.encoder.name, "epochs": epochs, "recipe_epochs": config.train.epochs,
            "early_stopping": bool(config.train.early_stopping),
            "precision": progress.get("precision"), "photos": counts,
            "exit": [step["exit"] for step in steps],
            "prepare_seconds": prepare["seconds"],
            "cache_seconds": round(train["seconds"] - progress["train_seconds"], 1), "cached_images": cached,
            "epoch_seconds": round(progress["train_seconds"] / epochs, 1),
            "score_split": split, "score_images": counts[split]["images"], "score_seconds": evaluate["seconds"],
            "caption_seconds": caption["seconds"], "captioned_images": len(photos)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="what captioner data flickr8k --from reads (a folder with the "
                        "archives, their contents, or photos with a dataset_flickr8k.json)")
    parser.add_argument("photos", type=Path, help="a folder of .jpg photos to caption as one's own (the first "
                        "--photos, sorted)")
    parser.add_argument("--photos", dest="count", type=int, default=5, help="how many of them (default: 5)")
    parser.add_argument("--epochs", type=int, default=1, help="training epochs (default: 1; the recipe's own: "
                        "the table gives the time per epoch)")
    parser.add_argument("--keep", type=Path, help="an empty folder to run in and keep (default: a temporary one)")
    args = parser.parse_args()
    photos = sorted(args.photos.glob("*.jpg"))[:args.count]
    if not photos:
        sys.exit(f"{args.photos}: no .jpg photos")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="own_photos_"))
    try:
        entry = run_steps(args.source.resolve(), [p.resolve() for p in photos], folder, args.epochs)
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    if any(entry["exit"]):
        sys.exit(f"a command failed (exit statuses {entry['exit']}): nothing written")
    command = shlex.join(["python", "scripts/own_photos_time.py", "FLICKR8K", "PHOTOS", "--epochs", str(args.epochs)])
    path = write_result(RESULTS, entry, configs=[f"{RECIPE} train.epochs={args.epochs}"],
                        probes=[f"train {RECIPE}", f"decode {RECIPE}"], command=command)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
