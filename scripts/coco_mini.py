"""coco-mini, a few COCO 2017 train photos with their official captions and instance masks (research use, never
committed), as the studies read it: split ``test`` of a config. It is the folder named by the environment variable
``CAPTIONER_COCO_MINI`` (default ``data/coco-mini`` in the checkout), laid out as COCO ships it:
``annotations/captions_train2017.json``, ``annotations/instances_train2017.json`` and the photos in ``train2017/``.
Any COCO 2017 folder of that layout will do, ``captioner data coco --root data/coco --year 2017``'s too (all
118,287 photos: slow); the studies that ground on it skip the grounding when the folder is absent.

    from coco_mini import COCO_MINI, coco_mini_features, coco_mini_overrides     # in a script of this folder
"""

from __future__ import annotations

import json
import os
from pathlib import Path

COCO_MINI = Path(os.environ.get("CAPTIONER_COCO_MINI") or Path(__file__).resolve().parent.parent / "data" / "coco-mini")


def coco_mini_features(features: str | Path) -> str:
    """The coco-mini feature cache beside a run's cache ``features`` (the same encoder settings)."""
    return str(Path(features).with_name(Path(features).name + "_coco_mini"))


def coco_mini_overrides(features: str | None) -> list[str]:
    """Overrides that make coco-mini split ``test`` of a config: its captions, images and instance masks, and the
    feature cache ``features`` (None: the images through the encoder)."""
    annotations = COCO_MINI / "annotations"
    return ["data.format=coco", f"data.captions={json.dumps({'test': str(annotations / 'captions_train2017.json')})}",
            f"data.images={json.dumps({'test': str(COCO_MINI / 'train2017')})}",
            f"data.instances={json.dumps({'test': str(annotations / 'instances_train2017.json')})}",
            f"data.features={json.dumps(features)}"]
