"""Shared fixtures: a tiny COCO-format caption dataset of real image files, and tiny configs."""

import json
import os

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")

COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220)}


def _write_split(root, split, count, first_id, rng):
    images, annotations = [], []
    for k in range(count):
        image_id = first_id + k
        colour = list(COLOURS)[k % 3]
        pixels = rng.integers(0, 60, size=(32, 32, 3), dtype=np.uint8)
        x = 0 if (k // 3) % 2 == 0 else 16
        pixels[8:24, x : x + 16] = COLOURS[colour]
        side = "left" if x == 0 else "right"
        name = f"{split}/{image_id}.png"
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / "images" / name)
        images.append({"id": image_id, "file_name": name, "width": 32, "height": 32})
        for j, caption in enumerate([f"a {colour} square on the {side}", f"the {colour} square is {side}"]):
            annotations.append({"id": image_id * 10 + j, "image_id": image_id, "caption": caption})
    (root / "annotations").mkdir(exist_ok=True)
    (root / "annotations" / f"captions_{split}.json").write_text(json.dumps({"images": images, "annotations": annotations}))


@pytest.fixture(scope="session")
def tiny_coco(tmp_path_factory):
    """12 train / 6 val / 6 test 32x32 images of a coloured square on one side, two captions each."""
    root = tmp_path_factory.mktemp("tiny_coco")
    rng = np.random.default_rng(0)
    for split, count, first in (("train", 12, 100), ("val", 6, 200), ("test", 6, 300)):
        _write_split(root, split, count, first, rng)
    return root


def tiny_config(root, out, **sections):
    """A complete config for a seconds-long run on ``tiny_coco`` (random-init encoder, no downloads)."""
    from captioner.config import load_config

    splits = ("train", "val", "test")
    overrides = [
        f"data.captions={json.dumps({s: str(root / 'annotations' / f'captions_{s}.json') for s in splits})}",
        f"data.images={json.dumps({s: str(root / 'images') for s in splits})}",
        "data.vocab_min_count=1", f"run.out={out}", "run.device=cpu",
        "encoder.name=mobilenet_v2", "encoder.pretrained=false", "encoder.image_size=32", "encoder.stride=16",
        "model.lstm.attention_dim=8", "model.lstm.embed_dim=8", "model.lstm.hidden_dim=16", "model.lstm.dropout=0.2",
        "train.epochs=2", "train.batch_size=5", "train.log_every=1", "train.wandb=disabled", "train.early_stopping=0",
        "decode.max_length=8", "train.amp=false",   # train.amp=auto may measure: tests/test_precision.py
    ]
    for section, values in sections.items():
        overrides += [f"{section}.{k}={json.dumps(v)}" for k, v in values.items()]
    return load_config(None, overrides)


def memorise(decoder, features, captions, lr: float, steps: int = 150) -> float:
    """Fit ``decoder`` to ``captions`` (B, T+1) of ``features`` (B, L, D) with Adam; returns the last loss."""
    import torch

    from captioner.training.losses import caption_loss

    optimizer = torch.optim.Adam(decoder.parameters(), lr=lr)
    for _ in range(steps):
        out = decoder(features, captions)
        loss = caption_loss(out.logits, captions[:, 1:], out.alpha, 0.0)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


@pytest.fixture(scope="session")
def served_checkpoints(tiny_coco, tmp_path_factory):
    """Checkpoints for the server tests, by run name: ``soft`` (2x2 grid), ``hard`` (hard attention), both
    with region positions (regions then differ even where the untrained encoder's features hardly do),
    ``wide`` (32x64 images: a 2x4 grid) and ``transformer``, each trained for a few seconds on ``tiny_coco``."""
    from captioner.training.engine import train

    root = tmp_path_factory.mktemp("served")
    positions = {"region_position": "sinusoidal", "position_dim": 8}
    runs = {"soft": {"model": {"lstm": positions}}, "hard": {"model": {"lstm": {**positions, "attention_mode": "hard"}}},
            "wide": {"encoder": {"image_size": [32, 64]}},
            "transformer": {"model": {"decoder": "transformer", "transformer": {"d_model": 16, "num_layers": 1,
                                                                              "num_heads": 2, "ffn_dim": 32}},
                            "loss": {"doubly_stochastic": 0.0}}}
    return {name: train(tiny_config(tiny_coco, root / name, train={"epochs": 1}, **sections))["checkpoint"]
            for name, sections in runs.items()}
