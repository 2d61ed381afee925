"""Feature caching speed, printed as JSON: images/s of ``build_feature_cache`` (decode JPEG, resize,
encoder forward, write the fp16 memory map) for the paper's VGG-19 at 224 px and MobileNetV2 at 128 px
(the demo's encoder), with 0 and 2 DataLoader workers decoding the images. The images are synthetic
640 x 480 JPEGs (the size of a COCO photo); the encoders are randomly initialised (speed does not
depend on the weights). Runs on CUDA when present.

    python benchmarks/bench_feature_cache.py [--quick] [--threads N] [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import add_arguments, setup
from PIL import Image
from captioner.results.record import report

from captioner.data.feature_cache import build_feature_cache
from captioner.data.images import image_transform
from captioner.data.readers import ImageRecord
from captioner.models.encoder import EncoderConfig, build_encoder

ENCODERS = {"vgg19 224px": {"name": "vgg19", "image_size": 224},
            "mobilenet_v2 128px stride 16": {"name": "mobilenet_v2", "image_size": 128, "stride": 16}}


def write_photos(folder: Path, count: int) -> list[ImageRecord]:
    rng = np.random.default_rng(0)
    records = []
    for i in range(count):
        path = folder / f"{i}.jpg"
        Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(path, quality=90)
        records.append(ImageRecord(image_id=i + 1, path=path, captions=["a photo"]))
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    device = setup(args)
    root = Path(tempfile.mkdtemp(prefix="bench_cache_"))
    try:
        records = write_photos(root, 32 if args.quick else 256)
        result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                  "threads": torch.get_num_threads(), "images": len(records), "images_per_s": {}}
        for name, settings in ENCODERS.items():
            # prepared for inference, as captioner cache-features runs it
            encoder = build_encoder(EncoderConfig(pretrained=False, **settings)).prepare_for_inference().to(device)
            for workers in (0, 2):
                folder = root / f"cache_{settings['name']}_{workers}"
                started = time.perf_counter()
                build_feature_cache(encoder, records, folder, transform=image_transform(encoder), batch_size=32,
                                    num_workers=workers, progress=False)
                seconds = time.perf_counter() - started
                result["images_per_s"][f"{name}, {workers} workers"] = round(len(records) / seconds, 1)
                shutil.rmtree(folder)
        # keyed by the recipes' data paths with randomly initialised encoders, as timed: no weights needed offline
        configs = ["defaults encoder.pretrained=false", "demo_soft encoder.pretrained=false"]
        report("feature_cache", result, configs=configs, probes=[f"data {c}" for c in configs])
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
