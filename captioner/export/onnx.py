"""The encoder and the decoder's per-word step as ONNX graphs (``captioner export --onnx``), and the decode-step
interface over ONNX Runtime that :mod:`captioner.decoding.search` drives like a torch decoder.

Three float32 graphs, batch sizes dynamic, named in ``config.json``'s ``onnx`` block::

    encoder.onnx       images (B, 3, H, W): RGB in [0, 1] at encoder.image_size (resized antialiased),
                       normalised inside -> regions (B, L, D)
    decoder_init.onnx  regions (B, L, D) -> state.NAME for each NAME of onnx.state
    decoder_step.onnx  tokens (N,) int64 and every state.NAME -> log_probs (N, V), next.NAME for each entry of
                       onnx.changing, alpha (N, L) (hard attention: also the one-hot chosen)

Entries of ``onnx.fixed_state`` keep one row per image; the others have N = B * k rows, image b's in rows
b*k .. b*k+k-1, which a search reorders and feeds back as state.NAME (the Transformer's caches grow a position
per word). Tokens: ``<pad>`` 0, ``<start>`` 1 (the first step's), ``<end>`` 2, ``<unk>`` 3.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from pathlib import Path

import torch
from torch import nn

from captioner.errors import CaptionerError, first_line
from captioner.models.captioner import Captioner
from captioner.models.encoder import Encoder


ENCODER, DECODER_INIT, DECODER_STEP = "encoder.onnx", "decoder_init.onnx", "decoder_step.onnx"
EXPORTER_RELEASE = (2, 11)      # torch 2.9 fails to export the step, 2.10 drops the Transformer's empty caches
EXAMPLE_IMAGES, EXAMPLE_ROWS, EXAMPLE_WORDS = 2, 3, 2    # what the graphs are traced with: 2 images, 3 rows each,
                                                         # after 2 words (no size of 0 or 1 for export to fix)


def require_onnx() -> None:
    """Raise one line naming what to install when the ``onnx`` extra is missing."""
    missing = [name for name in ("onnx", "onnxscript", "onnxruntime") if not _importable(name)]
    if missing:
        raise CaptionerError(f"ONNX needs {', '.join(missing)}: pip install 'captioner[onnx]'")


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


class _Step(nn.Module):
    """``decoder.step`` with the state as positional tensors in ``names`` order, for export."""

    def __init__(self, decoder: nn.Module, names: list[str], changing: list[str], attention: list[str]):
        super().__init__()
        self.decoder, self.names, self.changing, self.attention = decoder, names, changing, attention

    def forward(self, tokens: torch.Tensor, *state: torch.Tensor):
        log_probs, new_state, attention = self.decoder.step(tokens, dict(zip(self.names, state)))
        return (log_probs, *(new_state[n] for n in self.changing), *(attention[a] for a in self.attention))


class _Init(nn.Module):
    """``decoder.init_state`` with the state as a tuple in ``names`` order, for export."""

    def __init__(self, decoder: nn.Module, names: list[str]):
        super().__init__()
        self.decoder, self.names = decoder, names

    def forward(self, regions: torch.Tensor):
        state = self.decoder.init_state(regions)
        return tuple(state[n] for n in self.names)


def _export(module: nn.Module, args: tuple, path: Path, input_names: list[str], output_names: list[str],
            dynamic_shapes) -> None:
    """``torch.onnx.export`` (the dynamo exporter) of ``module`` into one self-contained file, quietly."""
    require_onnx()
    chatty = [logging.getLogger(name) for name in ("onnx_ir", "onnxscript", "torch.onnx")]
    levels = [logger.level for logger in chatty]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.inference_mode(False), \
            torch.no_grad():
        warnings.simplefilter("ignore")
        for logger in chatty:
            logger.setLevel(logging.WARNING)
        try:
            torch.onnx.export(module, args, str(path), dynamo=True, input_names=input_names, output_names=output_names,
                              dynamic_shapes=dynamic_shapes, external_data=False, verbose=False)
        except Exception as err:     # the exporter's own errors are many and long: the first line says which
            raise CaptionerError(f"{path.name}: ONNX export failed ({first_line(err)})") from None
        finally:
            for logger, level in zip(chatty, levels):
                logger.setLevel(level)


def export_onnx(model: Captioner, out: Path) -> dict:
    """Write :data:`ENCODER`, :data:`DECODER_INIT` and :data:`DECODER_STEP` of ``model`` (float32, on the CPU, its
    encoder prepared for inference) into ``out``; returns their description for ``config.json`` (see the module's
    docstring). Hard attention with ``model.lstm.hard_decode=sample`` is refused: its draws would come from ONNX
    Runtime's generator, not captioner's."""
    release = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])
    if release < EXPORTER_RELEASE:
        raise CaptionerError(f"ONNX export needs torch {'.'.join(map(str, EXPORTER_RELEASE))} or newer, this is "
                             f"{torch.__version__} (its exporter fails on these graphs): pip install 'torch>=2.11,<2.15'")
    decoder, encoder = model.decoder, model.encoder
    if decoder.samples_locations and decoder.config.hard_decode == "sample":
        raise CaptionerError("model.lstm.hard_decode=sample draws attention locations at random: export with "
                             "model.lstm.hard_decode=argmax for ONNX")
    dynamic = torch.export.Dim.DYNAMIC
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(EXAMPLE_IMAGES, 3, *encoder.image_size, generator=generator)
    _export(encoder, (images,), out / ENCODER, ["images"], ["regions"], ({0: dynamic},))
    with torch.no_grad():
        regions = encoder(images)
        state = decoder.init_state(regions)
    names = list(state)
    fixed = [n for n in names if n in set(getattr(decoder, "fixed_state", ()))]
    changing = [n for n in names if n not in fixed]
    _export(_Init(decoder, names), (regions,), out / DECODER_INIT, ["regions"], [f"state.{n}" for n in names],
            ({0: dynamic},))
    # the state after EXAMPLE_WORDS words of EXAMPLE_ROWS hypotheses per image; a dimension that grows from word
    # to word (a key/value cache) is dynamic, as is every first dimension
    rows = torch.arange(EXAMPLE_IMAGES).repeat_interleave(EXAMPLE_ROWS)
    state = {n: v if n in fixed else v.index_select(0, rows) for n, v in state.items()}
    vocab_size = decoder.config.vocab_size
    shapes = []
    with torch.no_grad():
        for _ in range(EXAMPLE_WORDS + 1):
            shapes.append({n: v.shape for n, v in state.items()})
            tokens = torch.randint(4, vocab_size, (len(rows),), generator=generator)
            _, state, attention = decoder.step(tokens, state)
    growing = {n: [d for d in range(1, len(shapes[-1][n])) if shapes[-1][n][d] != shapes[-2][n][d]] for n in names}
    attention_names = sorted(attention)
    step_state = {n: v for n, v in state.items() if n in names}
    dims = tuple({0: dynamic, **{d: dynamic for d in growing[n]}} for n in names)
    _export(_Step(decoder, names, changing, attention_names), (tokens, *(step_state[n] for n in names)),
            out / DECODER_STEP, ["tokens", *(f"state.{n}" for n in names)],
            ["log_probs", *(f"next.{n}" for n in changing), *attention_names],
            ({0: dynamic}, dims))
    return {"encoder": ENCODER, "decoder_init": DECODER_INIT, "decoder_step": DECODER_STEP, "state": names,
            "fixed_state": fixed, "changing": changing, "attention": attention_names, "dtype": "float32"}


def _session(path: Path):
    """An ONNX Runtime session of ``path`` on as many threads as torch uses, on the CUDA provider where the
    installed ONNX Runtime has it, else the CPU's."""
    require_onnx()
    import onnxruntime

    if not path.is_file():
        raise CaptionerError(f"{path}: missing (export the model with --onnx)")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in onnxruntime.get_available_providers()]
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=providers)
    except Exception as err:      # onnxruntime raises its own Fail/InvalidGraph/... types
        raise CaptionerError(f"{path}: not a loadable ONNX graph ({first_line(err)})") from None


def _array(tensor: torch.Tensor):
    return tensor.detach().cpu().contiguous().numpy()


class OnnxEncoder(nn.Module):
    """:data:`ENCODER` through ONNX Runtime, with the sizes of the torch encoder it was exported from (``image_size``,
    ``interpolation``, ``grid``, ``feature_dim``), so that image transforms and grids are those of the torch model."""

    def __init__(self, path: Path, like: Encoder):
        super().__init__()
        self.session = _session(path)
        self.image_size, self.interpolation = tuple(like.image_size), like.interpolation
        self.grid, self.feature_dim = tuple(like.grid), like.feature_dim

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) in [0, 1] -> regions (B, L, D)."""
        (regions,) = self.session.run(["regions"], {"images": _array(images.float())})
        return torch.from_numpy(regions)


class OnnxDecoder(nn.Module):
    """The decode-step interface of :mod:`captioner.models.decoder` (``init_state``, ``step``, ``fixed_state``) over
    :data:`DECODER_INIT` and :data:`DECODER_STEP` in ONNX Runtime, described by ``config.json``'s ``onnx`` block."""

    def __init__(self, folder: Path, described: dict, samples_locations: bool):
        super().__init__()
        self.init_session = _session(folder / described["decoder_init"])
        self.step_session = _session(folder / described["decoder_step"])
        self.names, self.changing = list(described["state"]), list(described["changing"])
        self.fixed_state = tuple(described["fixed_state"])
        self.attention_names = list(described["attention"])
        self.step_outputs = ["log_probs", *(f"next.{n}" for n in self.changing), *self.attention_names]
        self.samples_locations = samples_locations

    def init_state(self, regions: torch.Tensor) -> dict[str, torch.Tensor]:
        outputs = self.init_session.run([f"state.{n}" for n in self.names], {"regions": _array(regions.float())})
        return {name: torch.from_numpy(value) for name, value in zip(self.names, outputs)}

    def step(self, tokens: torch.Tensor, state: dict[str, torch.Tensor]):
        feeds = {"tokens": _array(tokens.long()), **{f"state.{n}": _array(state[n]) for n in self.names}}
        outputs = dict(zip(self.step_outputs, self.step_session.run(self.step_outputs, feeds)))
        new_state = {**state, **{n: torch.from_numpy(outputs[f"next.{n}"]) for n in self.changing}}
        attention = {a: torch.from_numpy(outputs[a]) for a in self.attention_names}
        return torch.from_numpy(outputs["log_probs"]), new_state, attention


def onnx_captioner(folder: Path, described: dict, model: Captioner) -> Captioner:
    """``model`` (loaded from the export ``folder``) with its encoder and decoder replaced by their ONNX graphs in
    ONNX Runtime; ``described``: the export's ``config.json``."""
    graphs = described.get("onnx")
    if graphs is None:
        raise CaptionerError(f"{folder}: exported without ONNX graphs "
                             "(captioner export --checkpoint CKPT --out DIR --onnx)")
    return Captioner(OnnxEncoder(folder / graphs["encoder"], model.encoder),
                     OnnxDecoder(folder, graphs, model.decoder.samples_locations)).eval()
