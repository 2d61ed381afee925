"""coco-mini, the 80 COCO photos with their official captions and instance masks beside the checkout
(``../shared/data/coco-mini``, research use, never committed), as the studies read it: split ``test`` of a config.

    from coco_mini import COCO_MINI, coco_mini_features, coco_mini_overrides     # in a script of this folder
"""

from __future__ import annotations

import json
from pathlib import Path

COCO_MINI = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "coco-mini"


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
