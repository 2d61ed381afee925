"""Configuration as plain data: nested dicts loaded from YAML, with dotted command-line overrides.

Sections: ``run``, ``data``, ``encoder``, ``model``, ``loss``, ``train``, ``decode``. Every default is written
once: here for the sections that have no class behind them, and in the config dataclass of the code that
reads them for the others (``encoder`` from :class:`~captioner.models.encoder.EncoderConfig`, ``decode`` from
:class:`~captioner.decoding.search.DecodeConfig`, ``model.lstm`` and ``model.transformer`` from each
registered decoder's config dataclass, see :data:`captioner.models.captioner.DECODERS`). :func:`defaults`
assembles them.

A YAML file or an override may only set keys that exist (a typo is an error naming the key, with the
closest known key as a suggestion). Overrides are ``section.key=value`` with ``value`` parsed as YAML
(``model.lstm.attention_dim=256``, ``encoder.grid=[7,7]``, ``run.device=cpu``). Configs written before the
decoders had sections of their own (flat ``model.*`` keys, ``train.label_smoothing``) are translated once,
on reading, by :func:`translate_legacy`. Every run writes its resolved config as ``config.yaml``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import inspect
import logging
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

from captioner.decoding.search import DecodeConfig
from captioner.errors import CaptionerError
from captioner.models.captioner import DECODER_DATA_FIELDS, DECODERS
from captioner.models.encoder import EncoderConfig
from captioner.utils import write_file

log = logging.getLogger(__name__)

SECTIONS: dict = {
    "run": {
        "out": "runs/default",      # run directory: checkpoints, metrics.jsonl, config.yaml
        "seed": 0,                  # seeds Python and torch; data order depends only on it and the epoch
        "device": "auto",           # auto | cpu | cuda | cuda:N
    },
    "data": {
        "format": "coco",           # coco: official captions JSON per split; karpathy: one split file
        "captions": {},             # coco: {split: captions_*.json}
        "images": {},               # coco: {split: image folder that file_name is relative to}
        "instances": {},            # optional {split: instances_*.json}: shapes measures, attention grounding
        "karpathy": None,           # karpathy: dataset_{coco,flickr8k,flickr30k}.json
        "image_root": None,         # karpathy: folder that each entry's filepath/filename is relative to
        "restval": "train",         # karpathy: the split that 'restval' images join
        "features": None,           # feature cache folder (captioner cache-features); None = raw images
        "vocab": None,              # a vocabulary file (captioner data vocab); None = built from the train split
        "vocab_min_count": 5,       # words seen fewer times in the train captions become <unk>
        "vocab_max_size": None,     # at most this many words (specials included); None = no limit
        "max_caption_length": 20,   # words; longer captions are cut
        "num_workers": 0,           # DataLoader worker processes (persistent; pinned memory on CUDA)
        "max_pixels": 64_000_000,   # images with more pixels are refused before decoding
        "strict": False,            # unreadable images stop the run instead of being skipped
        "bucket_by_length": False,  # batches of similar caption length (less padding), order still random
    },
    "model": {
        "decoder": "lstm",          # lstm (Show, Attend and Tell) | transformer; its settings: model.<decoder>.*
    },
    "loss": {
        "doubly_stochastic": 1.0,   # lambda of the doubly stochastic attention regulariser
        "doubly_stochastic_scale": "caption",  # caption: the term per caption | word: per word, as the cross-entropy (the paper's balance)
        "label_smoothing": 0.0,     # mix of the uniform distribution into the word targets
        "entropy_weight": 0.002,    # hard attention: lambda_e of the entropy bonus
        "baseline_decay": 0.9,      # hard attention: b_k = decay * b_{k-1} + (1 - decay) * reward
        "hard_reward": "sequence",  # hard attention: sequence: log p(y | s, a) (the paper) | per_word: divided by caption length
    },
    "train": {
        "epochs": 20,               # passes over the training captions
        "batch_size": 64,           # captions per step (the global batch under torchrun)
        "lr": 4e-4,                 # Adam learning rate of the decoder
        "encoder_lr": 1e-4,         # of the fine-tuned encoder blocks
        "weight_decay": 0.0,        # Adam L2 penalty
        "grad_clip": 5.0,           # clip the gradient norm to this; 0 = no clipping
        "lr_schedule": "none",      # none | step | cosine | rsqrt (per step, after the warm-up)
        "warmup_steps": 0,          # linear warm-up of the learning rate over this many steps
        "lr_step_epochs": 10,       # lr_schedule step: decay every this many epochs
        "lr_gamma": 0.5,            # lr_schedule step: by this factor
        "early_stopping": 5,        # epochs without improvement of train.metric; 0 = never stop early
        "metric": "CIDEr",          # CIDEr | BLEU-4
        "val_beam": 1,              # beam size for validation decoding (1 = greedy)
        "val_max_images": 1000,     # validation decodes at most this many images
        "checkpoint_every": 0,      # also save 'last' every N steps (0 = at epoch ends only)
        "nonfinite": "stop",        # a NaN/inf loss: stop (keeping the last good checkpoint) | skip the batch
        "log_every": 50,            # a metrics.jsonl line every this many steps
        "wandb": "offline",         # offline | online | disabled
        "wandb_project": "captioner",  # the W&B project the run logs to
        "wandb_entity": None,       # the W&B user or team; None = your default entity
        "wandb_tags": [],           # W&B tags of the run, e.g. [coco, soft]
        "amp": "auto",              # mixed precision: auto | true | false. auto: on CUDA (bf16 where supported, else fp16 with a gradient scaler); on a CPU bf16 only where it has native bf16 and a start-up probe finds the step 1.25x faster
        "compile": False,           # torch.compile: the whole model on CUDA, the decoder's per-word step on CPU
        "channels_last": True,      # channels-last memory format for the CNN when fine-tuning on CUDA
        "init_from": None,          # a checkpoint to start from: its weights, vocabulary, model and encoder settings
        "objective": "xe",          # xe: cross-entropy (the loss section) | scst: self-critical training on CIDEr-D
        "scst_after_epoch": 0,      # objective scst: this many epochs of cross-entropy first
        "scst_samples": 5,          # objective scst: captions sampled per image (train.batch_size counts images)
        "scst_baseline": "mean",    # mean: of the image's other samples (Luo 2020) | greedy: its greedy caption's reward
        "scst_temperature": 1.0,    # objective scst: sampling temperature
        "scst_bleu_weight": 0.0,    # objective scst: reward = CIDEr-D + this * BLEU-4
        "scst_count_end": True,     # objective scst: <end> counts as a word in the reward, so captions learn to stop
    },
}
ORDER = ("run", "data", "encoder", "model", "loss", "train", "decode")


def dataclass_settings(cls, exclude: Iterable[str] = ()) -> dict:
    """``{field: default}`` of a config dataclass, without the fields in ``exclude``."""
    out = {}
    for field in dataclasses.fields(cls):
        if field.name in exclude:
            continue
        if field.default is not dataclasses.MISSING:
            out[field.name] = copy.deepcopy(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            out[field.name] = field.default_factory()
        else:
            raise TypeError(f"{cls.__name__}.{field.name} needs a default to be a setting")
    return out


def defaults() -> dict:
    """Every setting with its default, as one nested dict (a fresh copy)."""
    config = {name: copy.deepcopy(SECTIONS[name]) for name in ORDER if name in SECTIONS}
    config["encoder"] = dataclass_settings(EncoderConfig)
    config["decode"] = dataclass_settings(DecodeConfig)
    for name, entry in DECODERS.items():
        config["model"][name] = dataclass_settings(entry.config, DECODER_DATA_FIELDS)
    return {name: config[name] for name in ORDER}


def _unknown(key: str, where: str, base: dict, prefix: str) -> CaptionerError:
    dotted = prefix + key
    known = list(_flat_defaults())
    leaf = dotted.rsplit(".", 1)[-1]
    same_leaf = [k for k in known if k.rsplit(".", 1)[-1] == leaf and k != dotted]
    close = same_leaf or difflib.get_close_matches(dotted, known, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else f" (known here: {', '.join(sorted(base))})"
    return CaptionerError(f"{where}: unknown setting '{dotted}'{hint}")


def _merge(base: dict, update: dict, where: str, prefix: str = "") -> dict:
    """Merge ``update`` into ``base`` in place; a key ``base`` lacks is an error. A dict setting whose default
    is empty (``data.captions``) takes any keys; one with keys of its own (a section) is merged key by key."""
    for key, value in update.items():
        if key not in base:
            raise _unknown(key, where, base, prefix)
        if isinstance(base[key], dict) and base[key]:
            if not isinstance(value, dict):
                raise CaptionerError(f"{where}: '{prefix}{key}' is a section of settings, not a value")
            _merge(base[key], value, where, f"{prefix}{key}.")
        else:
            base[key] = _checked(f"{prefix}{key}", value, where)
    return base


# The least value of numeric settings that have one (a batch of 0 captions, a beam of 0, no epochs).
MINIMUM = {
    "run.seed": 0, "data.vocab_min_count": 1, "data.max_caption_length": 1, "data.num_workers": 0,
    "data.max_pixels": 1, "train.epochs": 1, "train.batch_size": 1, "train.lr": 0, "train.encoder_lr": 0,
    "train.weight_decay": 0, "train.grad_clip": 0, "train.warmup_steps": 0, "train.lr_step_epochs": 1,
    "train.lr_gamma": 0, "train.early_stopping": 0, "train.val_beam": 1, "train.val_max_images": 1,
    "train.checkpoint_every": 0, "train.log_every": 1, "train.scst_after_epoch": 0, "train.scst_samples": 1,
    "train.scst_temperature": 0, "train.scst_bleu_weight": 0, "loss.doubly_stochastic": 0,
    "loss.label_smoothing": 0, "loss.entropy_weight": 0, "loss.baseline_decay": 0, "encoder.image_size": 1,
    "encoder.fine_tune_blocks": 0, "decode.beam": 1, "decode.max_length": 1, "decode.min_length": 0,
    "decode.block_ngram": 0, "decode.beam_groups": 1, "decode.diversity": 0, "decode.n_best": 1,
    "decode.top_k": 0, "decode.top_p": 0, "model.lstm.attention_dim": 1, "model.lstm.embed_dim": 1,
    "model.lstm.hidden_dim": 1, "model.lstm.dropout": 0, "model.lstm.position_dim": 1,
    "model.lstm.location_samples": 1, "model.transformer.d_model": 1, "model.transformer.num_layers": 1,
    "model.transformer.num_heads": 1, "model.transformer.ffn_dim": 1, "model.transformer.dropout": 0,
    "model.transformer.max_length": 1,
}
# Settings that also take another kind of value than their default's: ``[H, W]`` for a square size.
ALSO = {"encoder.image_size": list}
# Settings that take one of a few values of different kinds.
CHOICES = {"train.amp": (True, False, "auto")}


def _checked(dotted: str, value, where: str):
    """``value`` for setting ``dotted`` if it is of its default's kind (an int for an int, a number for a float,
    true/false for a flag, text for text; anything where the default is None) and not below its
    :data:`MINIMUM`, or one of its :data:`CHOICES`; else a :class:`~captioner.errors.CaptionerError` naming the setting and the value.
    A number in text for a float setting is read as the number (YAML reads ``1e-4`` as text)."""
    if dotted in CHOICES:
        choices = CHOICES[dotted]
        if not any(value is choice if isinstance(choice, bool) else value == choice for choice in choices):
            names = [str(c).lower() if isinstance(c, bool) else str(c) for c in choices]
            raise CaptionerError(f"{where}: {dotted} must be {', '.join(names[:-1])} or {names[-1]}, got {value!r}")
        return value
    default = _flat_defaults().get(dotted)
    if default is None:
        return value
    if isinstance(default, float) and isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(default, bool):
        kind, ok = "true or false", isinstance(value, bool)
    elif isinstance(default, int):
        kind, ok = "a whole number", isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        kind, ok = "a number", isinstance(value, (int, float)) and not isinstance(value, bool)
    elif isinstance(default, str):
        kind, ok = "text", isinstance(value, str)
    else:
        kind, ok = f"a {type(default).__name__}", isinstance(value, type(default))
    if not ok and dotted in ALSO and isinstance(value, ALSO[dotted]):
        return value
    if not ok:
        raise CaptionerError(f"{where}: {dotted} must be {kind}, got {value!r}")
    if dotted in MINIMUM and value < MINIMUM[dotted]:
        raise CaptionerError(f"{where}: {dotted} must be at least {MINIMUM[dotted]}, got {value!r}")
    return value


@functools.cache
def _flat_defaults() -> dict:
    """``{"section.key": default}`` of every setting (a section's own keys included)."""
    def flatten(tree: dict, prefix: str) -> dict:
        flat = {}
        for key, value in tree.items():
            flat[prefix + key] = value
            if isinstance(value, dict):
                flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    return flatten(defaults(), "")


def parse_override(text: str) -> dict:
    """``"model.lstm.attention_dim=256"`` -> ``{"model": {"lstm": {"attention_dim": 256}}}``."""
    if "=" not in text:
        raise CaptionerError(f"override '{text}': expected section.key=value")
    dotted, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else None
    except yaml.YAMLError as err:
        raise CaptionerError(f"override '{text}': value is not valid YAML ({err.problem})") from None
    nested: dict = value
    for key in reversed(dotted.strip().split(".")):
        nested = {key: nested}
    return nested


def apply_overrides(config: dict, overrides: Sequence[str]) -> dict:
    """``config`` with ``overrides`` applied in order (later wins); unknown keys are errors. In place."""
    for text in overrides:
        _merge(config, parse_override(text), f"override '{text}'")
    return config


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> dict:
    """Defaults, then the YAML file, then the overrides (later wins). Returns a fresh nested dict."""
    config = defaults()
    if path is not None:
        path = Path(path)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except OSError as err:
            raise CaptionerError(f"{path}: cannot read config ({err.strerror})") from None
        except UnicodeDecodeError:
            raise CaptionerError(f"{path}: not a text (UTF-8) YAML file") from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise CaptionerError(f"{path}: invalid YAML{where}") from None
        if not isinstance(loaded, dict):
            raise CaptionerError(f"{path}: a config must be a mapping of sections")
        loaded, moved = translate_legacy(loaded)
        if moved:
            log.warning("%s: settings in their old places were read as %s", path, ", ".join(moved))
        _merge(config, loaded, str(path))
    return apply_overrides(config, overrides)


# Loss settings that used to sit in ``model``, and the one that sat in ``train``.
LEGACY_LOSS_KEYS = ("doubly_stochastic", "doubly_stochastic_scale", "entropy_weight", "baseline_decay", "hard_reward")


def translate_legacy(config: dict) -> tuple[dict, list[str]]:
    """A config written before decoders had sections of their own, in today's layout: flat ``model.KEY``
    moves to ``model.<decoder>.KEY`` (the config's decoder for keys that several decoders have, else the
    decoder that has the key), loss settings to ``loss``. Returns the new config and the moved keys' new
    names. Keys no decoder knows stay where they are (and are reported as unknown later)."""
    config = copy.deepcopy(config)
    model, moved = config.get("model"), []
    if not isinstance(model, dict):
        return config, moved
    decoder = model.get("decoder", "lstm")
    owners = {name: {f.name for f in dataclasses.fields(entry.config)} - set(DECODER_DATA_FIELDS)
              for name, entry in DECODERS.items()}
    for key in [k for k, v in model.items() if k != "decoder" and k not in owners and not isinstance(v, dict)]:
        if key in LEGACY_LOSS_KEYS:
            target = ("loss", key)
        else:
            having = [name for name, keys in owners.items() if key in keys]
            if not having:
                continue
            target = ("model", decoder if decoder in having else having[0], key)
        value = model.pop(key)
        section = config.setdefault(target[0], {})
        if len(target) == 3:
            section = section.setdefault(target[1], {})
        section.setdefault(target[-1], value)
        moved.append(".".join(target))
    train = config.get("train")
    if isinstance(train, dict) and "label_smoothing" in train:
        config.setdefault("loss", {}).setdefault("label_smoothing", train.pop("label_smoothing"))
        moved.append("loss.label_smoothing")
    return config, moved


def complete(config: dict) -> dict:
    """A saved config (a checkpoint's) in today's layout, completed with today's defaults for settings added
    since it was written, so older checkpoints keep loading; its own values win, and settings no longer
    known are kept."""
    def fill(base: dict, saved: dict) -> dict:
        for key, value in saved.items():
            if isinstance(base.get(key), dict) and base[key] and isinstance(value, dict):
                fill(base[key], value)
            else:
                base[key] = value
        return base

    return fill(defaults(), translate_legacy(config)[0])


def save_config(config: dict, path: str | Path) -> None:
    write_file(path, yaml.safe_dump(config, sort_keys=False))


def _comments(source: str, pattern: str) -> dict[str, str]:
    """``{name: comment}`` of the lines of ``source`` that match ``pattern`` (groups: name, comment)."""
    return {m.group(1): (m.group(2) or "").strip() for m in re.finditer(pattern, source, re.MULTILINE)}


def _notes() -> dict[str, str]:
    """The comment beside each setting, by dotted name: this file's sections and the config dataclasses."""
    notes = {}
    source = inspect.getsource(inspect.getmodule(_notes))
    block = source[source.index("SECTIONS: dict = {"):source.index("\n}\n", source.index("SECTIONS: dict = {"))]
    section = None
    for line in block.splitlines():
        opening = re.match(r'^    "(\w+)": \{', line)
        setting = re.match(r'^        "(\w+)":[^#]*(?:#\s*(.*))?$', line)
        if opening:
            section = opening.group(1)
        elif setting and section:
            notes[f"{section}.{setting.group(1)}"] = (setting.group(2) or "").strip()
    dataclass_line = r"^    (\w+):[^#\n]*=[^#\n]*(?:#\s*(.*))?$"
    for section, cls in (("encoder", EncoderConfig), ("decode", DecodeConfig)):
        for key, note in _comments(inspect.getsource(cls), dataclass_line).items():
            notes[f"{section}.{key}"] = note
    for name, entry in DECODERS.items():
        for key, note in _comments(inspect.getsource(entry.config), dataclass_line).items():
            notes[f"model.{name}.{key}"] = note
    return notes


def config_reference() -> str:
    """Every setting with its default and the comment beside it where it is written, as one Markdown table
    per section (``model`` per decoder); the README's configuration reference is this text."""
    notes, lines = _notes(), []

    def table(title: str, rows: dict, prefix: str) -> None:
        nonlocal lines
        lines += [f"**{title}**", "", "| setting | default | meaning |", "|---|---|---|"]
        for key, value in rows.items():
            if isinstance(value, dict) and value and prefix == "model.":
                continue
            shown = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            lines.append(f"| `{prefix}{key}` | `{shown}` | {notes.get(prefix + key, '').replace('|', chr(92) + '|')} |")
        lines.append("")

    for name, values in defaults().items():
        table(name, values, f"{name}.")
        if name == "model":
            for decoder, settings in values.items():
                if isinstance(settings, dict):
                    table(f"model.{decoder}", settings, f"model.{decoder}.")
    return "\n".join(lines).rstrip() + "\n"
