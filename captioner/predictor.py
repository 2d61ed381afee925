"""The one way from trained weights to captions: a :class:`Predictor` holds the model, vocabulary and config of a
checkpoint or an export folder (``captioner export``), the encoder's image transform and the decode settings,
prepared once for inference (BatchNorms folded, the step compiled where ``decode.compile`` asks; or the
export's ONNX graphs in ONNX Runtime). Every command that captions, the server and the Python API go through it.
It works in three steps, each a method to call or override: :meth:`Predictor.preprocess` (an image file to the
encoder's input), :meth:`Predictor.forward` (a batch of inputs to generations) and :meth:`Predictor.postprocess`
(a generation to a :class:`CaptionResult`); :meth:`Predictor.caption` runs them over files in batches::

    from captioner import Predictor

    predictor = Predictor.load("runs/demo/soft/best.pt", beam=3, n_best=3)
    for result in predictor.caption(["a.jpg", "b.jpg"]):
        print(result.caption, result.log_prob, [beam.caption for beam in result.beams])
        print(result.attention["alpha"].shape)          # (words, gh, gw): where it looked for each word
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch
from PIL import Image

from captioner.checkpoint import knows_only_shapes, load_model, trained_on
from captioner.data.images import image_transform, load_image
from captioner.data.vocabulary import Vocabulary
from captioner.decoding.ensemble import ensemble_of
from captioner.decoding.search import DecodeConfig, Generation, decode
from captioner.errors import CaptionerError, ImageError
from captioner.evaluation.generate import generate_captions
from captioner.evaluation.grounding import boxes_of_named_objects
from captioner.export import RUNTIMES
from captioner.models.captioner import Captioner, compile_decoder

if TYPE_CHECKING:
    from captioner.config import Config
    from captioner.data.dataset import CaptionDataset


class Beam(NamedTuple):
    """One of the n best captions of an image: its text and total log-probability (``<end>`` included)."""

    caption: str
    log_prob: float


@dataclass
class CaptionResult:
    """The caption of one image, or the reason it could not be read (``error``)."""

    path: Path | None
    caption: str | None = None
    words: list[str] | None = None
    generation: Generation | None = None
    error: str | None = None
    grid: tuple[int, int] = (0, 0)
    beams: list[Beam] = dataclasses.field(default_factory=list)

    @property
    def log_prob(self) -> float | None:
        """The caption's total log-probability (``<end>`` included)."""
        return None if self.generation is None else self.generation.log_prob

    @property
    def attention(self) -> dict[str, torch.Tensor]:
        """Each word's attention maps over the region grid, ``(words, gh, gw)``: ``"alpha"`` (the weights; for a
        Transformer its cross-attention) and, for hard attention, ``"chosen"`` (the sampled cell)."""
        if self.generation is None:
            return {}
        return {name: attention_maps(self.generation, self.grid, name) for name in self.generation.attention}


def attention_maps(generation: Generation, grid: tuple[int, int], name: str = "alpha") -> torch.Tensor | None:
    """The per-word maps ``name`` of a generation as ``(T, gh, gw)`` (None when the decoder has none)."""
    maps = generation.attention.get(name)
    return None if maps is None else maps.reshape(-1, *grid)


SHAPES_WARNING = ("this model was trained on the synthetic shapes and knows only coloured shapes, not photos; for "
                  "photos, train one of the Flickr8k recipes that captioner config --list names (captioner data "
                  "flickr8k prepares their data)")
"""What a model of the synthetic shapes says when it is given other images (:meth:`Predictor.data_warning`)."""


def check_image_size(size: tuple[int, int], grid: tuple[int, int], name: str) -> None:
    """Raise :class:`~captioner.errors.ImageError` (naming ``name``) for an image of ``size`` (width, height) with
    fewer pixels along a side than the encoder's region ``grid`` (gh, gw) has regions: stretched to the encoder's
    input, its regions would repeat the same pixels (a 1x1 image: one colour everywhere), so its attention could
    point at nothing and its caption would describe nothing that is in it."""
    (width, height), (rows, columns) = size, grid
    if width < columns or height < rows:
        raise ImageError(f"{name}: {width}x{height} pixels is too small to caption (this model needs at least "
                         f"{columns}x{rows}, a pixel for each region of its {rows}x{columns} grid)")


class Predictor:
    """A trained captioner prepared for captioning (see the module's docstring). ``decode_config`` is the ``decode``
    section every call uses unless it passes its own; ``max_pixels``, the largest image it reads; ``trained_on``, the
    training data's name and kind (:func:`captioner.checkpoint.trained_on`; None: unknown)."""

    def __init__(self, model: Captioner, vocab: Vocabulary, config: Config, *,
                 decode_config: DecodeConfig | None = None, max_pixels: int | None = None,
                 trained_on: dict | None = None):
        self.model, self.vocab, self.config = model.eval(), vocab, config
        self.decode_config = decode_config or DecodeConfig.of(config)
        self.decode_config.check()
        self.max_pixels = max_pixels or config.data.max_pixels
        self.transform = image_transform(model.encoder)
        self.trained_on = trained_on

    @classmethod
    def load(cls, checkpoints: str | Path | Sequence[str | Path], *, device: str | torch.device = "cpu",
             overrides: Sequence[str] = (), beam: int | None = None, n_best: int | None = None,
             max_pixels: int | None = None, runtime: str = "torch") -> Predictor:
        """The predictor of a checkpoint or an export folder (``captioner export``), or of several decoded together
        as an ensemble (the first one's encoder, data and decode settings). ``overrides`` (``section.key=value``)
        change each config (model settings must still fit the weights); ``beam``, ``n_best`` and ``max_pixels``
        replace ``decode.beam``, ``decode.n_best`` and ``data.max_pixels``. ``runtime="onnx"`` runs the encoder
        and the decoder's steps in ONNX Runtime from an ``--onnx`` export, whose model and encoder settings cannot
        be overridden."""
        paths = [Path(checkpoints)] if isinstance(checkpoints, (str, Path)) else [Path(p) for p in checkpoints]
        if not paths:
            raise CaptionerError("no checkpoint given")
        if runtime not in RUNTIMES:
            raise CaptionerError(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
        fixed = [o for o in overrides if o.split(".", 1)[0] in ("model", "encoder")]
        if runtime == "onnx" and fixed:
            raise CaptionerError(f"override '{fixed[0]}': the model and encoder settings of ONNX graphs are fixed at "
                                 "export")
        loaded = [load_model(path, device, overrides) for path in paths]
        if runtime == "onnx":
            loaded = [(_onnx_model(path, model, payload), vocab, config, payload)
                      for path, (model, vocab, config, payload) in zip(paths, loaded)]
        decoder, vocab = ensemble_of([m for m, *_ in loaded], [v for _, v, *_ in loaded], [c for _, _, c, _ in loaded],
                                     [str(p) for p in paths])
        first, _, config, _ = loaded[0]
        model = first if len(loaded) == 1 else Captioner(first.encoder, decoder).eval()
        if config.decode.compile and runtime == "torch":
            compile_decoder(model.decoder, mode="reduce-overhead" if model.device.type == "cuda" else None,
                            targets=("step",))
        records = [trained_on(payload, member_config) for _, _, member_config, payload in loaded]
        return cls(model, vocab, config, decode_config=DecodeConfig.of(config, beam=beam, n_best=n_best),
                   max_pixels=max_pixels, trained_on=next(filter(knows_only_shapes, records), records[0]))

    @property
    def grid(self) -> tuple[int, int]:
        """The encoder's region grid ``(gh, gw)``, over which every attention map lies."""
        return tuple(self.model.encoder.grid)

    @property
    def image_size(self) -> tuple[int, int]:
        """The encoder's input size ``(H, W)``."""
        return tuple(self.model.encoder.image_size)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def data_warning(self, images: Sequence[str | Path | Image.Image] | None = None) -> str | None:
        """The one line to warn a user with when a model trained on the synthetic shapes is given ``images`` (None:
        images not known yet, such as a server's uploads) that are not the shapes data's own, else None. The
        shapes data's own are the files under the image folders its config names (``data.images``,
        ``data.image_root``): there the model is where it belongs."""
        if not knows_only_shapes(self.trained_on):
            return None
        data = self.config.data
        folders = [Path(folder).resolve() for folder in (*data.images.values(), data.image_root) if folder]
        if images is not None and all(not isinstance(image, Image.Image) and any(
                Path(image).resolve().is_relative_to(folder) for folder in folders) for image in images):
            return None
        return SHAPES_WARNING

    def with_decoding(self, **changes) -> Predictor:
        """This predictor (the same model, not a copy) with settings of its ``decode`` section changed (None values
        ignored): ``predictor.with_decoding(beam=1)``."""
        twin = object.__new__(Predictor)
        twin.__dict__.update(self.__dict__)
        twin.decode_config = dataclasses.replace(self.decode_config,
                                                 **{k: v for k, v in changes.items() if v is not None})
        twin.decode_config.check()
        return twin

    def preprocess(self, image: str | Path | Image.Image) -> torch.Tensor:
        """One image file (or PIL image) as the encoder's input: (3, H, W) floats in [0, 1]. Raises
        :class:`~captioner.errors.ImageError` for a file that cannot be read, holds more than ``max_pixels`` or is
        too small to caption (:func:`check_image_size`: a 1x1 image)."""
        picture = image.convert("RGB") if isinstance(image, Image.Image) else load_image(image, max_pixels=self.max_pixels)
        check_image_size(picture.size, self.grid, "image" if isinstance(image, Image.Image) else str(image))
        return self.transform(picture)

    @torch.inference_mode()
    def forward(self, images: torch.Tensor, names: Sequence[str] | None = None,
                decode_config: DecodeConfig | None = None) -> list[Generation]:
        """The captions of ``images`` (B, 3, H, W), floats in [0, 1] at the encoder's input size, as one batch, by
        ``decode_config`` (default: the predictor's). ``names`` identify the images for seeded sampling (the same
        draws batched or not)."""
        regions = self.model.regions(images=images.to(self.device))
        return decode(self.model.decoder, regions, self.vocab, decode_config or self.decode_config,
                      images=None if names is None else list(names))

    def postprocess(self, generation: Generation, path: Path | None = None) -> CaptionResult:
        """A generation as the result for the image at ``path``: its words, its caption, the n best captions."""
        words = [self.vocab.words[i] for i in generation.tokens]
        beams = [Beam(self.vocab.decode(b.tokens), b.log_prob) for b in generation.beams or [generation]]
        return CaptionResult(path, caption=" ".join(words), words=words, generation=generation, grid=self.grid,
                             beams=beams)

    def caption(self, images: Sequence[str | Path | Image.Image], *, batch_size: int = 16) -> list[CaptionResult]:
        """Caption image files (or PIL images) in batches of ``batch_size``: each image through :meth:`preprocess`,
        each batch through :meth:`forward`, each caption through :meth:`postprocess`. A file that cannot be read
        gets its ``error`` and the others go on."""
        paths = [None if isinstance(image, Image.Image) else Path(image) for image in images]
        results: list[CaptionResult | None] = [None] * len(paths)
        readable = []                           # (index, pixels, name) of each image read
        for index, (image, path) in enumerate(zip(images, paths)):
            try:
                readable.append((index, self.preprocess(image), str(path or f"image {index}")))
            except ImageError as err:
                results[index] = CaptionResult(path, error=str(err), grid=self.grid)
        for start in range(0, len(readable), batch_size):
            chunk = readable[start : start + batch_size]
            generations = self.forward(torch.stack([x for _, x, _ in chunk]), [name for *_, name in chunk])
            for (index, _, _), generation in zip(chunk, generations):
                results[index] = self.postprocess(generation, paths[index])
        return results

    def attend(self, image: str | Path, out: str | Path, *, instances: str | Path | None = None,
               title: str = "") -> CaptionResult:
        """Caption ``image`` and draw the paper-style attention figure into ``out``: the image, then each word's
        map (hard attention: its chosen cell too); with a COCO ``instances`` file, each word's panel outlines the
        boxes of the object it names. Raises :class:`~captioner.errors.ImageError` for an unreadable image."""
        (result,) = self.caption([image])
        if result.error:
            raise ImageError(result.error)
        boxes = boxes_of_named_objects(instances, image, result.words) if instances else None
        draw_generation_figure(load_image(image, max_pixels=self.max_pixels), result.words, result.generation,
                               self.grid, out, name=str(image), boxes=boxes, title=title + result.caption)
        return result

    def generate(self, dataset: CaptionDataset, *, max_images: int | None = None,
                 progress: bool = False) -> dict[int, Generation]:
        """The captions of a dataset's images (of its split, as evaluation decodes them), by image id."""
        return generate_captions(self.model, dataset, self.vocab, self.decode_config, max_images=max_images,
                                 progress=progress)


def _onnx_model(path: Path, model: Captioner, payload: dict) -> Captioner:
    """The ONNX Runtime twin of ``model``, loaded from the export folder ``path``."""
    from captioner.export.onnx import onnx_captioner

    if "export" not in payload:
        raise CaptionerError(f"{path}: runtime onnx needs an export folder made with --onnx "
                             "(captioner export --checkpoint CKPT --out DIR --onnx), not a checkpoint file")
    return onnx_captioner(path, payload["export"], model)


ATTENTION_DECIMALS = 6
"""Attention weights in JSON (``captioner caption --json``, ``captioner serve``) are rounded to this many decimals: a
third of the bytes of a float's full repr to write, send and parse, and far finer than any display."""


def caption_json(result: CaptionResult) -> dict:
    """One captioned file as plain data: the caption, its words and log-probability, each word's attention
    maps as ``gh x gw`` nested lists (``"alpha"``; ``"chosen"`` for hard attention) rounded to
    :data:`ATTENTION_DECIMALS`, and, with ``decode.n_best`` above 1, the n best captions."""
    maps = {name: [[[round(v, ATTENTION_DECIMALS) for v in row] for row in word] for word in words.tolist()]
            for name, words in result.attention.items()}
    beams = result.beams if result.generation.beams else []
    return {"image": str(result.path), "caption": result.caption, "words": result.words,
            "log_prob": round(result.log_prob, 4), "grid": list(result.grid), "attention": maps,
            "beams": [{"caption": b.caption, "log_prob": round(b.log_prob, 4)} for b in beams]}


def draw_generation_figure(image: Image.Image, words: list[str], generation: Generation, grid: tuple[int, int],
                           out: str | Path, *, name: str, boxes=None, title: str = "") -> Path:
    """The paper-style figure of ``generation`` (its ``words``) on ``image`` into ``out``, the decoder's maps
    over its ``grid``; raises :class:`~captioner.errors.CaptionerError` (naming ``name``) when it has none."""
    # imported here: matplotlib is slow to import, and only a figure needs it
    from captioner.visualisation.attention_figure import draw_attention_figure

    alpha = attention_maps(generation, grid, "alpha")
    chosen = attention_maps(generation, grid, "chosen")
    if alpha is None:
        raise CaptionerError(f"{name}: this model's decoder reports no attention maps to draw")
    return draw_attention_figure(image, words, alpha.numpy(), out, boxes=boxes,
                                 chosen=None if chosen is None else chosen.numpy(), title=title)
