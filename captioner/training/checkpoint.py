"""Checkpoints: one dict per file, written atomically, read back with ``torch.load(weights_only=True)``.

A checkpoint holds ``model``, ``optimizer``, ``scheduler`` (state dicts), ``epoch``, ``step``,
``batch_in_epoch``, ``rng``, ``vocab`` (the word list), ``config`` (the resolved config) and ``best``
(the best validation score so far). Only tensors and plain Python data go in, so the safe unpickler
loads it and a crafted file cannot run code.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch

from captioner.config import with_defaults
from captioner.data.vocabulary import Vocabulary
from captioner.errors import CaptionerError
from captioner.utils import atomic_write


def save_checkpoint(payload: dict, path: str | Path) -> None:
    try:
        atomic_write(path, lambda handle: torch.save(payload, handle))
    except OSError as err:
        raise CaptionerError(f"{path}: cannot write checkpoint ({err.strerror or err}); earlier checkpoints are intact") from None


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise CaptionerError(f"{path}: checkpoint not found")
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
        raise CaptionerError(f"{path}: not a readable checkpoint ({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
    if not isinstance(payload, dict) or not {"model", "vocab", "config"} <= payload.keys():
        raise CaptionerError(f"{path}: not a captioner checkpoint (needs model, vocab and config)")
    return payload


def load_model(path: str | Path, device: str | torch.device = "cpu"):
    """``(model, vocab, config, payload)`` from a checkpoint, the model in eval mode on ``device``."""
    from captioner.models.captioner import build_model

    payload = load_checkpoint(path, map_location=device)
    vocab = Vocabulary.from_dict(payload["vocab"])
    config = with_defaults(payload["config"])
    try:
        model = build_model(config, len(vocab), pretrained=False)
    except (ValueError, KeyError, TypeError) as err:
        raise CaptionerError(f"{path}: its config cannot be built by this version ({err})") from None
    expected = model.state_dict()
    for name, tensor in payload["model"].items():
        shape = expected.get(name, tensor).shape
        if tensor.shape != shape and len(vocab) in shape:
            raise CaptionerError(f"{path}: its vocabulary of {len(vocab)} words does not match its weights "
                                 f"({name} is {tuple(tensor.shape)}, not {tuple(shape)})")
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as err:
        detail = str(err).splitlines()[0]
        raise CaptionerError(f"{path}: weights do not fit the architecture its config describes ({detail})") from None
    return model.to(device).eval(), vocab, config, payload
