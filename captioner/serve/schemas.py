"""The JSON of the API, as pydantic models: FastAPI validates the answers with them and publishes them in
its OpenAPI schema (``/openapi.json``)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import Generation
from captioner.predictor import ATTENTION_DECIMALS, attention_maps
from captioner.serve.batching import Timing


class Error(BaseModel):
    """Every refusal and failure."""

    error: str = Field(description="what is wrong, in one line", examples=["upload.png: not an image file PIL can read"])


class Beam(BaseModel):
    """One caption and where the model looked for each of its words."""

    caption: str = Field(examples=["a red square left of a blue circle"])
    tokens: list[str] = Field(description="the T words of the caption")
    log_prob: float = Field(description="total log-probability of the words and <end>")
    attention: list[list[list[float]]] | None = Field(
        description="T maps of gh x gw non-negative weights (rows of the region grid, top first; rounded to 6 "
                    "decimals), one per word; "
                    "null for a decoder that reports none")
    chosen: list[list[int] | None] | None = Field(
        description="hard attention: per word the [row, column] of the grid cell it chose; null otherwise")


class Timings(BaseModel):
    decode_ms: float = Field(description="decoding the batch this image was part of (encoder and beam search)")
    queue_ms: float = Field(description="waiting for that batch to start")
    batch_size: int = Field(description="images decoded together in that batch")


class ImageSize(BaseModel):
    width: int
    height: int


class CaptionResponse(Beam):
    """The best caption (the fields of :class:`Beam`), the n best, the grid and the timings."""

    checkpoint: str = Field(description="the run that captioned the image")
    grid: tuple[int, int] = Field(description="(gh, gw) of the attention maps")
    image: ImageSize = Field(description="the image after its EXIF orientation")
    beams: list[Beam] = Field(description="the n best captions (n = beam size), best first; beams[0] is the caption")
    timings: Timings


class TrainedOn(BaseModel):
    """The data a model was trained on, as its checkpoint records it."""

    name: str | None = Field(description="the dataset, null when not known", examples=["shapes", "flickr8k", "coco"])
    kind: str = Field(examples=["synthetic shapes", "photos"])


class ModelInfo(BaseModel):
    name: str = Field(description="what requests call it: its run folder's name", examples=["soft"])
    decoder: str = Field(examples=["lstm", "transformer"])
    attention: str = Field(description="soft | hard | marginal | variational | none (LSTM), cross-attention "
                                       "(Transformer)")
    encoder: str = Field(examples=["mobilenet_v2"])
    vocab_size: int
    grid: tuple[int, int] = Field(description="(gh, gw) region grid of the attention maps")
    image_size: tuple[int, int] = Field(description="(H, W) the encoder reads")
    beam: int = Field(description="beam size used when a request names none")
    max_length: int = Field(description="most words of a caption")
    max_pixels: int = Field(description="larger images are refused from their header")
    trained_on: TrainedOn | None = Field(description="its training data; null when its checkpoint does not say")
    warning: str | None = Field(description="what a user should know before trusting its captions (a model of the "
                                "synthetic shapes knows nothing of photos); null when nothing")


class Overlay(BaseModel):
    """How `captioner attend` draws a word's attention, which the page repeats."""

    max_side: int = Field(description="the image is shown with its longer side at most this many pixels")
    dimmed_brightness: float = Field(description="brightness where the map is zero (1 at the map's maximum)")
    chosen_color: str = Field(description="outline of hard attention's chosen cell")


class ModelsResponse(BaseModel):
    models: list[ModelInfo] = Field(description="the loaded checkpoints; the first is the default")
    max_beam: int
    max_upload_mb: float
    overlay: Overlay


class OverlayOperators(BaseModel):
    """A (gh, gw) map becomes ``rows @ map @ columns.T`` over (height, width) pixels: the upsampling of
    `captioner attend` (bilinear between cell centres and a gaussian blur, or nearest cells for the raw grid)."""

    rows: list[list[float]] = Field(description="height x gh")
    columns: list[list[float]] = Field(description="width x gw")


class Health(BaseModel):
    status: str = Field(examples=["ok"], description='"ok", or why the models cannot decode now (their process '
                                                     "restarting, or ended for good): requests then get 503")
    models: list[str]
    queued: int = Field(description="requests waiting for the decoder")
    in_flight: int = Field(description="caption and figure requests in the server (at most its --max-queue)")


def beam_json(generation: Generation, vocab: Vocabulary, grid: tuple[int, int]) -> dict:
    """One decoded caption as the JSON of a :class:`Beam`, its maps reshaped to the ``grid``, the weights
    rounded to :data:`ATTENTION_DECIMALS`."""
    words = [vocab.words[index] for index in generation.tokens]
    alpha = attention_maps(generation, grid, "alpha")
    chosen = attention_maps(generation, grid, "chosen")
    return {"caption": " ".join(words), "tokens": words, "log_prob": generation.log_prob,
            "attention": None if alpha is None else alpha.double().numpy().round(ATTENTION_DECIMALS).tolist(),
            "chosen": None if chosen is None else [_cell(one_hot.tolist()) for one_hot in chosen]}


def _cell(one_hot: list[list[float]]) -> list[int] | None:
    """``[row, column]`` of the hot cell of a ``(gh, gw)`` one-hot map; None when the map is all zero."""
    for row, values in enumerate(one_hot):
        for column, value in enumerate(values):
            if value > 0:
                return [row, column]
    return None


def caption_response(name: str, beams: list[Generation], vocab: Vocabulary, grid: tuple[int, int],
                     size: tuple[int, int], timing: Timing) -> dict:
    """The JSON of a :class:`CaptionResponse` (the API tests check it against the model): ``beams`` (best
    first) of an image of ``size`` (width, height)."""
    shown = [beam_json(generation, vocab, grid) for generation in beams]
    return {**shown[0], "checkpoint": name, "grid": list(grid), "image": {"width": size[0], "height": size[1]},
            "beams": shown, "timings": {"decode_ms": timing.decode_ms, "queue_ms": timing.queue_ms,
                                        "batch_size": timing.batch_size}}
