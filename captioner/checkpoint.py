"""Checkpoints: one dict per file, written atomically, read back with ``torch.load(weights_only=True)``,
and the models they hold; a model built from a config (:func:`build_model`) beside one loaded from a checkpoint
(:func:`load_model`). Training writes them; evaluation, the CLI, the demo, reports and the server
read them, so this module belongs to no single layer.

A checkpoint holds ``model``, ``optimizer``, ``scheduler`` and ``loss`` (state dicts), ``progress`` (epoch,
step, best score, ...), ``rng``, ``vocab`` (the word list), ``config`` (the resolved config),
``captioner_version`` (the version that wrote it; absent before 0.2.0) and ``trained_on`` (the training data's
name and kind, :func:`data_record`; for an older checkpoint without it, :func:`trained_on` infers it). Only
tensors and plain Python data go in, so the safe unpickler loads it and a crafted file cannot run code.
Checkpoints written before the loss had a state of its own carry the REINFORCE baseline as
``decoder.reward_baseline`` / ``decoder.baseline_updates`` in ``model``: :func:`model_and_loss_states`
separates them.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

import torch

from captioner.config import Config, apply_overrides, complete
from captioner.core.files import atomic_write, file_sha256
from captioner.data.config import DataConfig
from captioner.data.shapes import annotation_info, is_shapes
from captioner.data.vocabulary import Vocabulary, with_training_counts
from captioner.errors import CaptionerError, first_line
from captioner.export.folder import CONFIG, is_export, read_export
from captioner.models.captioner import Captioner, build_captioner

LEGACY_LOSS_STATE = {"decoder.reward_baseline": "baseline", "decoder.baseline_updates": "baseline_updates"}
SHAPES_KIND = "synthetic shapes"
PHOTO_DATASETS = ("flickr30k", "flickr8k", "coco")     # the Karpathy split files' datasets, the longest name first
KARPATHY_DATASET = re.compile(rb'"dataset"\s*:\s*"([\w .-]{1,64})"')


def save_checkpoint(payload: dict, path: str | Path) -> None:
    try:
        atomic_write(path, lambda handle: torch.save(payload, handle))
    except OSError as err:
        raise CaptionerError(f"{path}: cannot write checkpoint ({err.strerror or err}); earlier checkpoints are intact") from None


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """The checkpoint dict of ``path``, its archive's checksums verified first (a flipped byte in a weight
    would otherwise load as a different model); raises :class:`~captioner.errors.CaptionerError` with one
    line for a missing, empty, truncated, damaged or foreign file. An export folder (``captioner export``) is
    read as the same dict, with the model, vocabulary and config but no training state
    (:func:`captioner.export.folder.read_export`)."""
    path = Path(path)
    if is_export(path):
        return read_export(path, map_location)
    if path.is_dir():
        raise CaptionerError(f"{path}: is a folder, neither a checkpoint file nor an exported model (no {CONFIG})")
    if not path.is_file():
        raise CaptionerError(f"{path}: checkpoint not found")
    if path.stat().st_size == 0:
        raise CaptionerError(f"{path}: file is empty (0 bytes)")
    _verify_archive(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        unsafe = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        if unsafe:  # the file asks to call or build something on loading: never done
            raise CaptionerError(f"{path}: refused: loading it would call {unsafe.group(1)} (checkpoints are read "
                                 "with torch.load(weights_only=True); a plain captioner checkpoint needs nothing else)"
                                 ) from None
        raise CaptionerError(f"{path}: not a readable checkpoint (not a torch.save file of plain data)") from None
    except (RuntimeError, EOFError, ValueError, OSError) as err:
        raise CaptionerError(f"{path}: not a readable checkpoint ({first_line(err)})") from None
    except Exception:   # a text or other foreign file can stop the unpickler with KeyError, IndexError, ...
        raise CaptionerError(f"{path}: not a readable checkpoint (not a torch.save file of plain data)") from None
    if not isinstance(payload, dict) or not {"model", "vocab", "config"} <= payload.keys():
        raise CaptionerError(f"{path}: not a captioner checkpoint (needs model, vocab and config)")
    return payload


def _verify_archive(path: Path) -> None:
    """Check every member of a ``torch.save`` zip archive against its CRC-32 (torch's reader does not); a file
    that is not a zip archive is left to ``torch.load``."""
    if not zipfile.is_zipfile(path):
        with path.open("rb") as handle:
            starts_as_archive = handle.read(4) == b"PK\x03\x04"
        if starts_as_archive:     # but its directory, written last, is missing
            raise CaptionerError(f"{path}: truncated or damaged (not a complete zip archive, as torch.save writes)")
        return
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise CaptionerError(f"{path}: truncated or damaged ({err})") from None
    if damaged is not None:
        raise CaptionerError(f"{path}: damaged: {damaged} fails its checksum (a corrupted copy or disk?)")


def checkpoint_digest(path: str | Path) -> str:
    """The SHA-256 that identifies a checkpoint: of the file, or of an export's ``config.json`` (which records its
    weights' SHA-256)."""
    return file_sha256(Path(path) / CONFIG if is_export(path) else path)


def checkpoint_folder(path: str | Path) -> Path:
    """Where a command writes what it finds about a checkpoint by default: the run folder holding the file, or the
    export folder itself."""
    return Path(path) if is_export(path) else Path(path).parent


def data_record(data: DataConfig) -> dict | None:
    """What a checkpoint records of the data its ``data`` section trains on: ``{"name", "kind"}``, e.g. ``{"name":
    "shapes", "kind": "synthetic shapes"}`` (the shapes annotation's ``info``), ``{"name": "flickr8k", "kind":
    "photos"}`` (a Karpathy split file's ``"dataset"``, else its file name), ``{"name": "coco", "kind": "photos"}`` or
    ``{"name": None, "kind": "photos"}`` (another COCO-format captions file); None when the files do not tell."""
    if data.format == "karpathy" and data.karpathy:
        path = Path(data.karpathy)
        stem = path.name.lower()
        return {"name": _karpathy_dataset(path) or next((name for name in PHOTO_DATASETS if name in stem), None),
                "kind": "photos"}
    captions = Path(data.captions["train"]) if data.format == "coco" and data.captions.get("train") else None
    if captions is None or not captions.is_file():
        return None
    info = annotation_info(captions)
    if is_shapes(info):
        return {"name": "shapes", "kind": SHAPES_KIND}
    description = str(info.get("description", "")).lower()
    return {"name": "coco" if "coco" in captions.name.lower() or "coco" in description else None, "kind": "photos"}


def _karpathy_dataset(path: Path) -> str | None:
    """The ``"dataset"`` field of a Karpathy split file, read from its first and last kilobytes (it stands at one
    end; the file can be hundreds of megabytes)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
            handle.seek(max(0, path.stat().st_size - 4096))
            tail = handle.read()
    except OSError:
        return None
    found = KARPATHY_DATASET.search(head) or KARPATHY_DATASET.search(tail)
    return found.group(1).decode().lower() if found else None


def trained_on(payload: dict, config: Config) -> dict | None:
    """The training data a checkpoint (or export) records (:func:`data_record`); for one written before the record,
    inferred from its ``config`` when the data files it names are here, else None (unknown)."""
    record = payload.get("trained_on")
    return record if isinstance(record, dict) else data_record(config.data)


def knows_only_shapes(record: dict | None) -> bool:
    """Whether a model of the training data ``record`` (:func:`trained_on`) was trained on the synthetic shapes."""
    return isinstance(record, dict) and record.get("kind") == SHAPES_KIND


def model_and_loss_states(payload: dict) -> tuple[dict, dict]:
    """The model's and the loss's state dicts of a checkpoint, older layouts included."""
    model_state = dict(payload["model"])
    loss_state = dict(payload.get("loss") or {})
    for old, new in LEGACY_LOSS_STATE.items():
        if old in model_state:
            loss_state.setdefault(new, model_state.pop(old))
    return model_state, loss_state


def build_model(config: Config, vocab_size: int, pretrained: bool | None = None) -> Captioner:
    """The model a resolved config describes, for a vocabulary of ``vocab_size`` words (new weights; a
    checkpoint's: :func:`load_model`). ``pretrained=False`` skips loading encoder weights (used when a
    checkpoint's weights are loaded right after)."""
    encoder = config.encoder
    if pretrained is not None:
        encoder = dataclasses.replace(encoder, pretrained=pretrained and encoder.pretrained)
    return build_captioner(encoder, config.model, vocab_size)


def load_model(path: str | Path, device: str | torch.device = "cpu", overrides: Sequence[str] = ()
               ) -> tuple[Captioner, Vocabulary, Config, dict]:
    """``(model, vocab, config, payload)`` from a checkpoint, the model in eval mode on ``device``, for decoding
    (its encoder prepared for inference: :meth:`~captioner.models.encoder.Encoder.prepare_for_inference`).

    ``config`` is the checkpoint's, completed with today's defaults, with ``overrides`` (``section.key=value``)
    applied and checked like any command's: decoding and data settings change freely; a model or encoder
    setting must still fit the weights."""
    payload = load_checkpoint(path, map_location=device)
    model, vocab, config = build_checkpoint_model(payload, path, overrides)
    model.encoder.prepare_for_inference()
    return model.to(device).eval(), vocab, config, payload


def build_checkpoint_model(payload: dict, path: str | Path, overrides: Sequence[str] = ()
                           ) -> tuple[Captioner, Vocabulary, Config]:
    """``(model, vocab, config)`` of a loaded checkpoint (:func:`load_checkpoint`), its weights as they were
    trained (the encoder not yet prepared for inference), on the CPU; ``path`` names it in errors."""
    try:
        vocab = Vocabulary.from_dict(payload["vocab"])
    except (KeyError, TypeError, ValueError) as err:
        raise CaptionerError(f"{path}: its vocabulary is malformed ({type(err).__name__}: {err})") from None
    config = apply_overrides(complete(payload["config"]), overrides)
    needs = [setting for setting, missing in (("decode.logit_adjustment", vocab.counts is None),
                                              ("decode.seen_endings", vocab.endings is None))
             if missing and getattr(config.decode, setting.split(".")[1])]
    if needs:                                                        # saved before vocabularies kept them
        try:
            vocab = with_training_counts(vocab, config.data)
        except CaptionerError as err:
            raise CaptionerError(f"{path}: {' and '.join(needs)} {'needs' if len(needs) == 1 else 'need'} what "
                                 f"its vocabulary counts of its training captions, which it was saved without, and its "
                                 f"training captions cannot be read ({err})") from None
    try:
        model = build_model(config, len(vocab), pretrained=False)
    except (ValueError, KeyError, TypeError, CaptionerError) as err:
        raise CaptionerError(f"{path}: its config cannot be built by this version ({err})") from None
    model_state, _ = model_and_loss_states(payload)
    expected = model.state_dict()
    for name, tensor in model_state.items():
        shape = expected.get(name, tensor).shape
        if tensor.shape != shape and len(vocab) in shape:
            raise CaptionerError(f"{path}: its vocabulary of {len(vocab)} words does not match its weights "
                                 f"({name} is {tuple(tensor.shape)}, not {tuple(shape)})")
    try:
        model.load_state_dict(model_state)
    except RuntimeError as err:
        detail = first_line(err)
        raise CaptionerError(f"{path}: weights do not fit the architecture its config describes ({detail})") from None
    return model, vocab, config
