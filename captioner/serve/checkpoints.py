"""The checkpoints a server holds: each loaded once at start-up and named by its run, with the decode
settings and pixel limit of its config, and the one batched n-best decoding every request goes through."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

import torch
from PIL import Image

from captioner.data.images import TO_FLOAT, image_transform, load_image_reduced
from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import DecodeConfig, Generation
from captioner.export.folder import is_export
from captioner.models.captioner import DECODERS
from captioner.predictor import Predictor, check_image_size

if TYPE_CHECKING:
    from captioner.config import Config


class Upload(NamedTuple):
    """An uploaded image as :meth:`ServedModel.read` returns it."""

    image: Image.Image              # RGB, possibly decoded smaller than the file's own size
    size: tuple[int, int]           # the file's own (width, height), after EXIF orientation
    pixels: torch.Tensor            # the encoder's input, uint8 (3, H, W)


@dataclass
class ServedModel:
    """One loaded checkpoint: its vocabulary and config, its ``decode_config`` (``beam`` is the default when a
    request names none), ``max_pixels``, the largest image it accepts, the ``transform`` of an upload into the
    encoder's input, the encoder's region ``grid`` ``(gh, gw)`` over which every attention map lies and its
    input ``image_size`` ``(H, W)``; ``predictor``, where this process decodes (``None`` in the server's
    process when the models decode in :mod:`~captioner.serve.decoding_process`: see :meth:`description`);
    ``trained_on``, the training data's name and kind (None: unknown), and ``warning``, what a model of the
    synthetic shapes says of uploads (:meth:`~captioner.predictor.Predictor.data_warning`)."""

    name: str
    path: Path
    vocab: Vocabulary
    config: Config
    decode_config: DecodeConfig
    max_pixels: int
    transform: Callable[[Image.Image], torch.Tensor]
    grid: tuple[int, int]
    image_size: tuple[int, int]
    predictor: Predictor | None = None
    trained_on: dict | None = None
    warning: str | None = None

    def description(self) -> ServedModel:
        """This checkpoint without its model: all a server needs to read uploads, draw attention and describe
        it, while the model decodes in another process (it pickles in a few kilobytes)."""
        return dataclasses.replace(self, predictor=None)

    def read(self, source: bytes | BinaryIO, name: str, shown_side: int = 0) -> Upload:
        """The uploaded file ``source`` (its bytes, or the open file) as an RGB image, decoded no larger than
        needed (:func:`~captioner.data.images.load_image_reduced`: both sides at least the encoder's input and
        ``shown_side``), its own size, and the encoder's input pixels (:meth:`caption` scales them to [0, 1], as
        :func:`~captioner.data.images.image_transform`); raises :class:`~captioner.errors.ImageError` (naming
        ``name``) with the checks of ``captioner caption``, a 1x1 image's among them
        (:func:`~captioner.predictor.check_image_size`)."""
        image, size = load_image_reduced(source, max(shown_side, *self.image_size), max_pixels=self.max_pixels,
                                         name=name)
        check_image_size(size, self.grid, name)
        return Upload(image, size, self.transform(image))

    @torch.inference_mode()
    def caption(self, images: Sequence[torch.Tensor], beam: int) -> list[list[Generation]]:
        """The ``beam`` best captions of each of ``images`` (each uint8 ``(3, H, W)`` from :meth:`read`), best
        first, decoded as one batched beam search (``beam=1``: greedy decoding, one caption each)."""
        if self.predictor is None:
            raise RuntimeError(f"{self.name}: this is a description of the checkpoint; its model decodes elsewhere")
        decode_config = dataclasses.replace(self.decode_config, beam=beam, n_best=beam)
        generations = self.predictor.forward(TO_FLOAT(torch.stack(list(images))), decode_config=decode_config)
        return [generation.beams or [generation] for generation in generations]

    def describe(self) -> dict:
        """What ``GET /api/models`` says about this checkpoint."""
        model = self.config.model
        return {"name": self.name, "decoder": model.decoder,
                "attention": DECODERS[model.decoder].attention_kind(model.chosen),
                "encoder": self.config.encoder.name, "vocab_size": len(self.vocab), "grid": list(self.grid),
                "image_size": list(self.image_size), "beam": self.decode_config.beam,
                "max_length": self.decode_config.max_length, "max_pixels": self.max_pixels,
                "trained_on": self.trained_on, "warning": self.warning}


def load_served_models(paths: Sequence[str | Path], device: torch.device, overrides: Sequence[str] = (), *,
                       beam: int | None = None, max_pixels: int | None = None) -> dict[str, ServedModel]:
    """Load every checkpoint once, named by its run folder (``runs/demo/soft/best.pt`` -> ``soft``; an export
    folder by its own name; a name taken already gets ``-2``, ``-3``, ...), in the order given. ``overrides`` apply to every checkpoint's
    config; ``beam`` and ``max_pixels`` replace their ``decode.beam`` and ``data.max_pixels``."""
    served: dict[str, ServedModel] = {}
    for path in map(Path, paths):
        predictor = Predictor.load(path, device=device, overrides=overrides, beam=beam, max_pixels=max_pixels)
        name = _unique((path.resolve().name if is_export(path) else Path(str(predictor.config.run.out)).name)
                       or path.parent.name, served)
        served[name] = ServedModel(name, path, predictor.vocab, predictor.config, predictor.decode_config,
                                   predictor.max_pixels, image_transform(predictor.model.encoder, to_float=False),
                                   predictor.grid, predictor.image_size, predictor, predictor.trained_on,
                                   predictor.data_warning())
    return served


def _unique(name: str, taken: dict) -> str:
    candidate, number = name, 1
    while candidate in taken:
        number += 1
        candidate = f"{name}-{number}"
    return candidate
