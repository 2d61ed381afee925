"""``captioner cache-features``: run a config's frozen encoder over the images of its splits into a feature cache
(:mod:`captioner.data.feature_cache`), which training and evaluation then read instead of the images."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from PIL import ImageOps
from torchvision import transforms

from captioner.config import Config
from captioner.core.devices import resolve_device
from captioner.data.feature_cache import build_feature_cache, mirrored_folder
from captioner.data.images import image_transform
from captioner.data.readers import read_splits
from captioner.errors import CaptionerError
from captioner.models.encoder import build_encoder


def cache_features(config: Config, splits: Sequence[str], folder: str | Path | None = None, *, batch_size: int = 32,
                   dtype: str = "float16", mirrored: bool = False, progress: bool = True) -> dict:
    """Cache the config's frozen encoder's features of every image of ``splits`` into ``folder`` (default
    ``data.features``; ``mirrored``: of each image flipped left to right, default ``data.features``/mirrored):
    what ``captioner cache-features`` and the demo run. Returns :func:`build_feature_cache`'s summary plus
    ``folder``."""
    if not folder and config.data.features:
        folder = mirrored_folder(config.data.features) if mirrored else config.data.features
    if not folder:
        raise CaptionerError("cache-features: set data.features in the config (or pass --out DIR)")
    by_split = read_splits(config.data, splits)     # a Karpathy file parsed once for every split
    records = [r for split in splits for r in by_split[split]]
    # frozen for good here: batch norms folded into their convolutions, channels-last (float rounding apart, the same)
    encoder = build_encoder(config.encoder).prepare_for_inference().to(resolve_device(config.run.device))
    transform = image_transform(encoder)
    if mirrored:
        transform = transforms.Compose([ImageOps.mirror, transform])
    result = build_feature_cache(encoder, records, folder, transform=transform, batch_size=batch_size,
                                 num_workers=config.data.num_workers, max_pixels=config.data.max_pixels,
                                 dtype=dtype, encoder_config=dataclasses.asdict(config.encoder), splits=splits,
                                 mirrored=mirrored, progress=progress)
    return {**result, "folder": str(folder)}
