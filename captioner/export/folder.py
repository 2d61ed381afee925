"""The files of an exported model, written and read back. An export folder holds::

    model.safetensors   the model's weights (float32, float16 or bfloat16): a format that loads without running
                        code; weights tied to another (the Transformer's output layer and word embedding) are
                        stored once and named in config.json
    config.json         what captioner needs to rebuild the model: the ``model``, ``encoder``, ``decode`` and
                        ``data`` settings, the vocabulary size, the encoder's sizes (``regions``), the weights'
                        dtype and SHA-256, the versions, the training data's name and kind (``trained_on``)
    vocab.json          the word list, index = position, with the training captions' counts and endings where the
                        checkpoint kept them (the format of ``data.vocab`` files)
    README.md           the model card (:mod:`captioner.workflows.model_card`)
    *.onnx              with ``--onnx`` (:mod:`captioner.export.onnx`)

:func:`read_export` returns the same plain dict as a checkpoint (``model``, ``vocab``, ``config``,
``captioner_version``), so that :func:`captioner.checkpoint.load_checkpoint` reads an export folder like a
checkpoint file and everything downstream takes either. Floating-point weights stored as float16 or bfloat16
are loaded into the model's float32 parameters (rounded once, when exported).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from captioner.core.files import file_sha256, read_json, write_file
from captioner.errors import CaptionerError
from captioner.version import __version__

FORMAT = "captioner-export"
FORMAT_VERSION = 1          # raised when a reader of an older version could not load what this one writes
WEIGHTS, CONFIG, VOCAB, CARD = "model.safetensors", "config.json", "vocab.json", "README.md"
CONFIG_SECTIONS = ("model", "encoder", "decode", "data")      # the settings an export keeps (run, train, loss: not)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def is_export(path: str | Path) -> bool:
    """Whether ``path`` is an export folder (a folder with a ``config.json``)."""
    path = Path(path)
    return path.is_dir() and (path / CONFIG).is_file()


def write_weights(state: dict[str, torch.Tensor], path: Path, dtype: str) -> dict:
    """Write a state dict to ``path`` as safetensors, floating-point tensors cast to ``dtype``, each tensor that
    is another's very view (tied weights) written once; returns the ``weights`` block of ``config.json``:
    file, dtype, SHA-256 and ``tied`` (``{name: the name it is stored under}``)."""
    from safetensors.torch import save

    tensors, tied, first_of = {}, {}, {}
    for name, tensor in state.items():
        view = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        if view in first_of:
            tied[name] = first_of[view]
            continue
        first_of[view] = name
        tensor = tensor.detach().cpu()
        tensors[name] = (tensor.to(DTYPES[dtype]) if tensor.is_floating_point() else tensor).contiguous().clone()
    data = save(tensors, metadata={"format": "pt", "captioner_version": __version__})
    write_file(path, data)
    return {"file": path.name, "dtype": dtype, "sha256": hashlib.sha256(data).hexdigest(), "tied": tied}


def write_export_files(out: Path, state: dict[str, torch.Tensor], vocab: dict, config: dict, *, dtype: str,
                       trained_with: str | None, regions: dict, trained_on: dict | None = None) -> dict:
    """Write ``model.safetensors``, ``vocab.json`` and ``config.json`` into the folder ``out``; returns what
    ``config.json`` says. ``config``: a checkpoint's plain config (only :data:`CONFIG_SECTIONS` are kept, the
    encoder's weight file left out: its weights are in the export); ``trained_with``: the version that wrote the
    checkpoint (None: older than 0.2.0); ``regions``: the encoder's input and output sizes (``image_size``
    [H, W], ``grid`` [gh, gw], ``feature_dim`` D), for readers that do not build the model; ``trained_on``: the
    training data's name and kind (:func:`captioner.checkpoint.trained_on`; None: unknown)."""
    weights = write_weights(state, out / WEIGHTS, dtype)
    write_file(out / VOCAB, json.dumps(vocab, ensure_ascii=False))
    settings = {name: config[name] for name in CONFIG_SECTIONS if name in config}
    settings["encoder"] = {**settings.get("encoder", {}), "weights": None}
    described = {"format": FORMAT, "format_version": FORMAT_VERSION, "captioner_version": __version__,
                 "trained_with": trained_with, "trained_on": trained_on, "vocab_size": len(vocab["words"]),
                 "regions": regions, "weights": weights, **settings}
    write_config(out, described)
    return described


def write_config(out: Path, described: dict) -> None:
    """(Re)write an export's ``config.json``."""
    write_file(out / CONFIG, json.dumps(described, indent=2, ensure_ascii=False))


def read_config(folder: Path) -> dict:
    """An export's ``config.json``, checked to be one this version can read."""
    described = read_json(folder / CONFIG)
    if not isinstance(described, dict) or described.get("format") != FORMAT:
        raise CaptionerError(f"{folder / CONFIG}: not the config.json of a captioner export (no \"format\": \"{FORMAT}\")")
    if not isinstance(described.get("format_version"), int) or described["format_version"] > FORMAT_VERSION:
        raise CaptionerError(f"{folder}: exported by captioner {described.get('captioner_version')} in a newer format "
                             f"({described.get('format_version')}) than this captioner {__version__} reads "
                             f"({FORMAT_VERSION}): upgrade captioner")
    return described


def read_export(folder: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """The checkpoint-shaped dict of an export folder: ``model`` (its state dict, tied weights filled in),
    ``vocab``, ``config`` (the kept sections), ``captioner_version`` (of the checkpoint it came from),
    ``trained_on`` (its training data, when recorded) and ``export`` (its ``config.json``). The weights' SHA-256 is
    checked first: a changed or damaged file is one line, not a different model."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    described = read_config(folder)
    weights = folder / described["weights"]["file"]
    if not weights.is_file():
        raise CaptionerError(f"{weights}: missing (the export's weights)")
    if file_sha256(weights) != described["weights"]["sha256"]:
        raise CaptionerError(f"{weights}: damaged or changed: its SHA-256 is not the one {CONFIG} records")
    try:
        state = load_file(weights, device=str(map_location))
    except (SafetensorError, OSError, ValueError) as err:
        raise CaptionerError(f"{weights}: not a readable safetensors file ({err})") from None
    for name, stored_as in described["weights"].get("tied", {}).items():
        state[name] = state[stored_as]
    vocab = read_json(folder / VOCAB)
    if not isinstance(vocab, dict) or not isinstance(vocab.get("words"), list) or len(vocab["words"]) != described["vocab_size"]:
        raise CaptionerError(f"{folder / VOCAB}: not the vocabulary of {described['vocab_size']} words {CONFIG} names")
    return {"model": state, "vocab": vocab, "config": {name: described[name] for name in CONFIG_SECTIONS if name in described},
            "captioner_version": described.get("trained_with"), "trained_on": described.get("trained_on"),
            "export": described}
