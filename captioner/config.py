"""Configuration as plain data: nested dicts loaded from YAML, with dotted command-line overrides.

``DEFAULTS`` lists every setting and its default; a YAML file or an override may only set keys that
exist there (a typo is an error, not a silently ignored setting). Overrides are ``section.key=value``
with ``value`` parsed as YAML (``model.attention_dim=256``, ``encoder.grid=[7,7]``, ``run.device=cpu``).
Every run writes its resolved config as ``config.yaml`` beside its checkpoints.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import yaml

from captioner.errors import CaptionerError

DEFAULTS: dict = {
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
    "encoder": {
        "name": "vgg19",            # vgg19 | resnet101 | resnet152 | efficientnet_lite0/1/2 | mobilenet_v2
        "pretrained": True,         # ImageNet weights (offline packages, else torchvision); False = random
        "weights": None,            # a state-dict file to load instead
        "image_size": 224,          # images are resized to this (int: square, or [H, W])
        "stride": None,             # feature-map stride, 16 or 32; None = the backbone default
        "grid": None,               # adaptive-average-pool the map to G x G or [gh, gw]; None = as is
        "fine_tune_blocks": 0,      # 0 = frozen encoder; k = fine-tune its last k blocks (from images)
    },
    "model": {
        "decoder": "lstm",          # lstm (Show, Attend and Tell) | transformer
        # LSTM decoder
        "attention": "additive",    # additive | dot | scaled_dot | general | none
        "score_activation": "tanh", # additive score: w . f(W_a a + W_h h) with f = tanh (the paper) | relu
        "attention_mode": "soft",   # soft | hard (stochastic hard attention trained with REINFORCE)
        "attention_dim": 512,       # A: size of the projected regions and query in the score
        "embed_dim": 512,           # word embedding size (and of the deep output layer)
        "hidden_dim": 512,          # LSTM state size
        "dropout": 0.5,             # before the output layer (LSTM); in every block (Transformer)
        "gate": "scalar",           # scalar | vector | none  (the paper's beta gate)
        "learned_sharpness": False, # LSTM: a learned inverse temperature exp(s) on the attention scores
        "region_position": "none",  # LSTM: none | sinusoidal (appended); transformer: + learned (added)
        "position_dim": 32,         # LSTM: size of the appended sinusoidal code
        "doubly_stochastic": 1.0,   # lambda of the doubly stochastic attention regulariser
        "doubly_stochastic_scale": "caption",  # caption: the term per caption | word: per word, as the cross-entropy (the paper's balance)
        # hard attention (attention_mode: hard), defaults of the paper's code
        "hard_decode": "argmax",    # argmax | sample: location chosen at inference
        "expectation_probability": 0.5,  # per caption, use alpha instead of a sampled location
        "location_samples": 1,      # location samples per caption in training
        "entropy_weight": 0.002,    # lambda_e of the entropy bonus
        "baseline_decay": 0.9,      # b_k = decay * b_{k-1} + (1 - decay) * log p(y | s, a)
        "hard_reward": "sequence",  # sequence: log p(y | s, a) (the paper) | per_word: divided by caption length
        # Transformer decoder (dropout and region_position above are shared)
        "d_model": 512,             # Transformer width
        "num_layers": 3,            # Transformer layers
        "num_heads": 8,             # attention heads per layer
        "ffn_dim": 2048,            # feed-forward inner size
        "tie_embeddings": True,     # the output layer's weight is the word embedding
        "attention_layer": -1,      # the layer whose cross-attention (mean over heads) is reported as alpha
        "max_length": 64,           # most word positions a caption or a decoding may use
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
        "amp": False,               # mixed precision on CUDA: bf16 where supported, else fp16 with a gradient scaler
        "compile": False,           # torch.compile the model (CUDA only; ignored on CPU)
        "channels_last": True,      # channels-last memory format for the CNN when fine-tuning on CUDA
        "label_smoothing": 0.0,     # mix of the uniform distribution into the word targets
    },
    "decode": {
        "beam": 3,                  # beam size for evaluate, caption and attend (1 = greedy)
        "max_length": 20,           # most words a generated caption may have
        "length_penalty": 0.0,      # score / length**alpha when choosing among finished beams
        "temperature": 1.0,         # softmax temperature when sampling
    },
}


def _merge(base: dict, update: dict, where: str) -> dict:
    for key, value in update.items():
        if key not in base:
            known = ", ".join(sorted(base))
            raise CaptionerError(f"{where}: unknown setting '{key}' (known: {known})")
        if isinstance(base[key], dict) and base[key] and isinstance(value, dict):
            _merge(base[key], value, f"{where}.{key}")
        else:
            base[key] = value
    return base


def parse_override(text: str) -> dict:
    """``"model.attention_dim=256"`` -> ``{"model": {"attention_dim": 256}}``."""
    if "=" not in text:
        raise CaptionerError(f"override '{text}': expected section.key=value")
    dotted, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else None
    except yaml.YAMLError as err:
        raise CaptionerError(f"override '{text}': value is not valid YAML ({err.problem})") from None
    keys = dotted.strip().split(".")
    nested: dict = value
    for key in reversed(keys):
        nested = {key: nested}
    return nested


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> dict:
    """Defaults, then the YAML file, then the overrides (later wins). Returns a fresh nested dict."""
    config = copy.deepcopy(DEFAULTS)
    if path is not None:
        path = Path(path)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except OSError as err:
            raise CaptionerError(f"{path}: cannot read config ({err.strerror})") from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark else ""
            raise CaptionerError(f"{path}: invalid YAML{where}") from None
        if not isinstance(loaded, dict):
            raise CaptionerError(f"{path}: a config must be a mapping of sections")
        _merge(config, loaded, str(path))
    for text in overrides:
        _merge(config, parse_override(text), f"override '{text}'")
    return config


def with_defaults(config: dict) -> dict:
    """A saved config (a checkpoint's) completed with today's defaults for settings added since it was
    written, so older checkpoints keep loading; its own values win, and settings no longer known are kept."""
    merged = copy.deepcopy(DEFAULTS)
    for section, values in config.items():
        if isinstance(values, dict) and isinstance(merged.get(section), dict):
            merged[section].update(values)
        else:
            merged[section] = values
    return merged


def save_config(config: dict, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config, sort_keys=False))


def config_reference() -> str:
    """Every setting of :data:`DEFAULTS` with its default and the comment beside it in this file, as one
    Markdown table per section (the README's configuration reference is this text)."""
    import inspect
    import re
    import sys

    source = inspect.getsource(sys.modules[__name__])
    block = source[source.index("DEFAULTS: dict = {"):source.index("\n}\n", source.index("DEFAULTS: dict = {"))]
    notes: dict[tuple[str, str], str] = {}
    section = None
    for line in block.splitlines():
        opening = re.match(r'^    "(\w+)": \{', line)
        if opening:
            section = opening.group(1)
            continue
        setting = re.match(r'^        "(\w+)":[^#]*(?:#\s*(.*))?$', line)
        if setting and section:
            notes[(section, setting.group(1))] = (setting.group(2) or "").strip()
    lines = []
    for name, values in DEFAULTS.items():
        lines += [f"**{name}**", "", "| setting | default | meaning |", "|---|---|---|"]
        for key, value in values.items():
            shown = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            note = notes.get((name, key), "").replace("|", "\\|")
            lines.append(f"| `{name}.{key}` | `{shown}` | {note} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
