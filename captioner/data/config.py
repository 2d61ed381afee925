"""The ``data`` section of a config: captions, images, vocabulary and the feature cache (read by the readers, the
vocabulary, the datasets and the feature cache; assembled into the whole config by :mod:`captioner.config`)."""

from __future__ import annotations

from dataclasses import dataclass

from captioner.core.settings import check_settings, setting
from captioner.errors import CaptionerError


@dataclass
class DataConfig:
    """The ``data`` section: captions, images, vocabulary and the feature cache."""

    format: str = setting("coco", "coco: official captions JSON per split; karpathy: one split file",
                          choices=("coco", "karpathy"))
    captions: dict[str, str] = setting({}, "coco: {split: captions_*.json}", affects_results=False)
    images: dict[str, str] = setting({}, "coco: {split: image folder that file_name is relative to}",
                                     affects_results=False)
    instances: dict[str, str] = setting({}, "optional {split: instances_*.json}: shapes measures, attention grounding",
                                        affects_results=False)
    karpathy: str | None = setting(None, "karpathy: dataset_{coco,flickr8k,flickr30k}.json", affects_results=False)
    image_root: str | None = setting(None, "karpathy: folder that each entry's filepath/filename is relative to",
                                     affects_results=False)
    restval: str = setting("train", "karpathy: the split that 'restval' images join", choices=("train", "val", "test"))
    max_train_images: int | None = setting(None, "only the first N train images, in the order read (a Karpathy "
                                                 "file's order; COCO: by image id); None = all", minimum=1)
    max_val_images: int | None = setting(None, "only the first N val images, as max_train_images; None = all",
                                         minimum=1)
    features: str | None = setting(None, "feature cache folder (captioner cache-features); None = raw images",
                                   affects_results=False)
    vocab: str | None = setting(None, "a vocabulary file (captioner data vocab); None = built from the train split",
                                affects_results=False)
    vocab_min_count: int = setting(5, "words seen fewer times in the train captions become <unk>", minimum=1)
    vocab_max_size: int | None = setting(None, "at most this many words (specials included); None = no limit",
                                         minimum=5)
    max_caption_length: int = setting(20, "words; longer captions are cut", minimum=1)
    num_workers: int = setting(0, "DataLoader worker processes (persistent; pinned memory on CUDA)", minimum=0,
                               affects_results=False)
    max_pixels: int = setting(64_000_000, "images with more pixels are refused before decoding", minimum=1,
                              affects_results=False)
    strict: bool = setting(False, "unreadable images stop the run instead of being skipped", affects_results=False)
    mirror: float = setting(0.0, "chance that a cross-entropy training caption is paired with its photo flipped left "
                                 "to right (its words left and right swapped); from cached features: the mirror "
                                 "cache <data.features>/mirrored (captioner cache-features --mirrored)",
                            minimum=0.0, maximum=1.0)
    bucket_by_length: bool = setting(False, "batches of similar caption length (less padding), order still random")

    def check(self) -> None:
        check_settings(self, "data")
        if self.format == "karpathy" and bool(self.karpathy) != bool(self.image_root):
            raise CaptionerError("data.format karpathy needs both data.karpathy and data.image_root")
