"""The captioning model: a CNN encoder (region features) and a decoder (words), built from their settings; the
registry of decoders that a config's ``model.decoder`` names and the ``model`` section (:class:`ModelConfig`), one
settings section per registered decoder; and the compilation of a decoder's steps."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from captioner.errors import CaptionerError
from captioner.models.encoder import Encoder, EncoderConfig, build_encoder
from captioner.models.lstm_decoder import LSTMDecoder, LSTMDecoderConfig
from captioner.models.transformer_decoder import TransformerDecoder, TransformerDecoderConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecoderEntry:
    """A registered decoder: its class (see :class:`captioner.models.decoder.CaptionDecoder`); its config dataclass,
    whose fields declared with :func:`captioner.core.settings.setting` are the settings ``model.<name>.*`` (default,
    meaning, type, bounds) and whose :data:`DECODER_DATA_FIELDS` are filled from the data and the encoder; the
    names of its methods that ``train.compile`` compiles (the work repeated at every word); a label for
    people; and how it attends, in words, given its settings."""

    decoder: type[nn.Module]
    config: type
    compile_targets: tuple[str, ...]
    label: str
    attention_kind: Callable[[object], str]


DECODER_DATA_FIELDS = ("vocab_size", "region_dim", "grid")
"""Config fields that come from the data and the encoder, not from the user's config."""

DECODERS: dict[str, DecoderEntry] = {}
"""The registered decoders by the name ``model.decoder`` gives them (:func:`register_decoder`)."""


def register_decoder(name: str, decoder: type[nn.Module], config: type, *, compile_targets: tuple[str, ...] = (),
                     label: str | None = None, attention_kind: Callable[[object], str] | None = None) -> None:
    """Make ``model.decoder=name`` build ``decoder(config(...))``; the fields of ``config`` declared as settings
    become ``model.<name>.*`` (see :class:`DecoderEntry`). ``config`` must be a dataclass with defaults for the
    :data:`DECODER_DATA_FIELDS` and a ``check()`` for settings that depend on one another."""
    names = {f.name for f in dataclasses.fields(config)} if dataclasses.is_dataclass(config) else set()
    if not set(DECODER_DATA_FIELDS) <= names or not callable(getattr(config, "check", None)):
        raise TypeError(f"a decoder config must be a dataclass with the fields {DECODER_DATA_FIELDS} and a check()")
    DECODERS[name] = DecoderEntry(decoder, config, tuple(compile_targets), label or name,
                                  attention_kind or (lambda settings: name))


def entry_of(decoder: nn.Module) -> DecoderEntry:
    """The registry entry of a decoder instance."""
    for entry in DECODERS.values():
        if type(decoder) is entry.decoder:
            return entry
    raise KeyError(f"{type(decoder).__name__} is not a registered decoder")


register_decoder("lstm", LSTMDecoder, LSTMDecoderConfig, compile_targets=("recurrent_step",), label="LSTM",
                 attention_kind=lambda s: "none" if s.attention == "none" else s.attention_mode)
register_decoder("transformer", TransformerDecoder, TransformerDecoderConfig, compile_targets=("run_layers",),
                 label="Transformer decoder",
                 attention_kind=lambda s: "cross-attention" if s.memory == "regions" else "none (mean of regions)")


class ModelConfig:
    """The ``model`` section: ``decoder`` names a registered decoder (:data:`~captioner.models.captioner.DECODERS`),
    and every registered decoder has its settings section, ``model.<name>`` (its config dataclass), read as an
    attribute: ``config.model.lstm.hidden_dim``; :attr:`chosen` is the one ``decoder`` names."""

    def __init__(self, decoder: str = "lstm", **sections):
        self.decoder = decoder
        self.sections = {name: sections.get(name) or entry.config() for name, entry in DECODERS.items()}

    def __getattr__(self, name: str):
        sections = self.__dict__.get("sections", {})
        if name in sections:
            return sections[name]
        raise AttributeError(f"model has no decoder section {name!r}")

    @property
    def chosen(self):
        """The settings of the decoder that ``decoder`` names."""
        return self.sections[self.decoder]

    def __eq__(self, other) -> bool:
        return isinstance(other, ModelConfig) and (self.decoder, self.sections) == (other.decoder, other.sections)

    def __repr__(self) -> str:
        return f"ModelConfig(decoder={self.decoder!r}, {', '.join(f'{k}={v!r}' for k, v in self.sections.items())})"

    def check(self) -> None:
        if self.decoder not in DECODERS:
            raise CaptionerError(f"model.decoder must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        try:
            self.chosen.check()
        except ValueError as err:
            raise CaptionerError(f"model.{self.decoder}: {err}") from None


class Captioner(nn.Module):
    """``encoder`` maps images (B, 3, H, W) in [0, 1] to regions (B, L, D); ``decoder`` maps regions to words."""

    def __init__(self, encoder: Encoder, decoder: nn.Module):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    @property
    def device(self) -> torch.device:
        """Where the weights are: the CPU for a model run by another runtime (ONNX Runtime), which has none here."""
        weight = next(self.decoder.parameters(), None)
        return torch.device("cpu") if weight is None else weight.device

    def regions(self, *, images: torch.Tensor | None = None, features: torch.Tensor | None = None) -> torch.Tensor:
        """Region features (B, L, D): encoded from ``images`` (B, 3, H, W), or ``features`` from a cache as they are."""
        if (images is None) == (features is None):
            raise ValueError("give exactly one of images or features")
        return self.encoder(images) if images is not None else features

    def forward(self, captions: torch.Tensor | None = None, *, images: torch.Tensor | None = None,
                features: torch.Tensor | None = None, sequence_loss=None, image_ids=None):
        """Teacher-forced pass over ``captions`` (B, T+1): the decoder's
        :class:`~captioner.models.decoder.TeacherForced` output. Or, given a ``sequence_loss`` (a callable
        ``sequence_loss(decoder, regions, image_ids, captions)`` on captions the decoder samples, e.g. self-critical
        training, with ``captions`` as references or None), its losses on the images: either way through
        ``forward``, so DistributedDataParallel sees the pass."""
        regions = self.regions(images=images, features=features)
        if sequence_loss is not None:
            return sequence_loss(self.decoder, regions, image_ids, captions)
        return self.decoder(regions, captions)


def build_decoder(model_config: ModelConfig, vocab_size: int, feature_dim: int, grid: tuple[int, int]) -> nn.Module:
    """The decoder named by ``model.decoder``, from its settings ``model.<decoder>``, for regions of size
    ``feature_dim`` on a ``grid``."""
    name = model_config.decoder
    if name not in DECODERS:
        raise CaptionerError(f"model.decoder must be one of {', '.join(DECODERS)}, not {name!r}")
    config = dataclasses.replace(model_config.chosen, vocab_size=vocab_size, region_dim=feature_dim, grid=tuple(grid))
    try:
        return DECODERS[name].decoder(config)
    except ValueError as err:
        raise CaptionerError(f"model.{name}: {err}") from None


def build_captioner(encoder_config: EncoderConfig, model_config: ModelConfig, vocab_size: int) -> Captioner:
    """Encoder and decoder from their settings, the ``encoder`` and ``model`` sections, for a vocabulary of
    ``vocab_size`` words (the whole config's model: :func:`captioner.checkpoint.build_model`)."""
    encoder = build_encoder(encoder_config)
    return Captioner(encoder, build_decoder(model_config, vocab_size, encoder.feature_dim, encoder.grid))


def compile_decoder(decoder: nn.Module, mode: str | None = None, targets: tuple[str, ...] | None = None) -> bool:
    """Compile the parts of ``decoder`` its registry entry names in ``compile_targets`` (the work repeated at every
    word of teacher forcing), or ``targets`` (e.g. ``("step",)`` for decoding), with ``torch.compile`` (dynamic shapes:
    the running rows shrink step by step; ``mode="reduce-overhead"`` replays CUDA graphs). Returns False,
    leaving the decoder as it is, when there is nothing to compile or no C++ compiler for the CPU backend; an
    error while compiling later falls back to running uncompiled (torch's ``suppress_errors``)."""
    targets = entry_of(decoder).compile_targets if targets is None else targets
    on_cpu = next(decoder.parameters()).device.type == "cpu"
    if not targets or on_cpu and not any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "c++", "clang++")):
        log.warning("torch.compile: %s; running uncompiled", "no C++ compiler found for torch.compile's CPU backend"
                    if targets else f"{type(decoder).__name__} names nothing to compile")
        return False
    torch._dynamo.config.suppress_errors = True
    # no "duck" sizes: at the first LSTM step every row runs, so the slice of h_{t-1} and the step's pre-activations
    # have one size, which torch.compile would otherwise take for a rule and compile again at the second step
    torch.fx.experimental._config.use_duck_shape = False
    for name in targets:
        setattr(decoder, name, torch.compile(getattr(decoder, name), dynamic=True, mode=mode))
    return True
