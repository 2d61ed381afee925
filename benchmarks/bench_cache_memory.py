"""Private memory of cached-feature training as the cache grows: it must stay bounded, because training
reads the fp16 memory map row by row instead of loading the cache into RAM.

For each cache size a fresh process writes a synthetic cache in the layout of
:mod:`captioner.data.feature_cache` (``N`` images of ``L x D`` fp16 features, one caption each), trains
one epoch over it with the real engine (a small soft-attention decoder, so reading dominates) and
samples its ``RssAnon`` (private memory) and ``RssFile`` (pages of the mapped file, which the operating
system may drop at will) every 20 ms. Prints JSON; the cache is deleted afterwards unless ``--keep``.

    python benchmarks/bench_cache_memory.py [--quick] [--threads N] [--images 5000 20000] [--regions 196] [--dim 512] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import PeakMemory, add_arguments, memory_kib, setup, write_synthetic_cache
from captioner.results.record import report

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("a", "red", "blue", "green", "circle", "square", "left", "right", "of", "the", "above", "below")


def write_captions(path: Path, image_ids: range, seed: int) -> None:
    rng = np.random.default_rng(seed)
    images = [{"id": i, "file_name": f"{i}.png", "width": 64, "height": 64} for i in image_ids]
    annotations = [{"id": i, "image_id": i, "caption": " ".join(rng.choice(WORDS, size=rng.integers(6, 14)))}
                   for i in image_ids]
    path.write_text(json.dumps({"images": images, "annotations": annotations}))


def measure(images: int, regions: int, dim: int, folder: Path) -> dict:
    """One cache size, in this process: write the cache, train one epoch, report the memory peaks."""
    from captioner.config import load_config
    from captioner.training.engine import train

    started = time.perf_counter()
    side = int(round(regions ** 0.5))
    gigabytes = write_synthetic_cache(folder / "cache", list(range(1, images + 1)), (side, regions // side), dim)
    write_seconds = time.perf_counter() - started
    write_captions(folder / "train.json", range(1, images - 31), seed=0)
    write_captions(folder / "val.json", range(images - 31, images + 1), seed=1)
    config = load_config(None, [
        f"data.captions={json.dumps({'train': str(folder / 'train.json'), 'val': str(folder / 'val.json')})}",
        f"data.images={json.dumps({'train': str(folder), 'val': str(folder)})}", f"data.features={folder / 'cache'}",
        "data.vocab_min_count=1", f"run.out={folder / 'run'}", "run.device=cpu",
        # VGG-19's conv layers give 14 x 14 x 512 at 224 px: the paper's features (built untrained, never run)
        "encoder.name=vgg19", "encoder.pretrained=false", f"encoder.image_size={16 * side}", "encoder.stride=16",
        "model.lstm.attention_dim=64", "model.lstm.embed_dim=64", "model.lstm.hidden_dim=128",
        "train.epochs=1", "train.batch_size=64", "train.val_max_images=32", "train.wandb=disabled",
        "train.log_every=100000", "train.early_stopping=0"])
    before = memory_kib()
    started = time.perf_counter()
    with PeakMemory() as sampler:
        result = train(config)
    seconds = time.perf_counter() - started
    return {"images": images, "regions": regions, "dim": dim, "cache_gb": round(gigabytes, 2),
            "cache_write_s": round(write_seconds, 1), "train_steps": result["step"], "train_s": round(seconds, 1),
            "rss_anon_before_mb": round(before["RssAnon"] / 1024), "peak_rss_anon_mb": round(sampler.peak["RssAnon"] / 1024),
            "peak_rss_file_mb": round(sampler.peak["RssFile"] / 1024)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, device=False)
    parser.add_argument("--images", type=int, nargs="+", help="cache sizes in images (default 5000 20000; --quick 1000 4000)")
    parser.add_argument("--regions", type=int, default=196)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--dir", help="where to write the caches (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the caches")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    setup(args)
    sizes = args.images or ([1000, 4000] if args.quick else [5000, 20000])
    if args.child:
        print(json.dumps(measure(args.images[0], args.regions, args.dim, Path(args.dir))))
        return 0
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="cache_memory_"))
    runs = []
    for images in sizes:
        folder = root / f"cache_{images}"
        command = [sys.executable, __file__, "--child", "--threads", str(args.threads), "--images", str(images), "--regions", str(args.regions),
                   "--dim", str(args.dim), "--dir", str(folder)]
        print(f"{images} images ...", file=sys.stderr)
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if not args.dir and not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    report("cache_memory", {"benchmark": "cache_memory", "runs": runs},
           configs=["demo_soft"], probes=["data demo_soft"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
