"""Configuration as typed sections, loaded from YAML with dotted command-line overrides.

A config is a :class:`Config`: the sections ``run``, ``data``, ``encoder``, ``model``, ``loss``, ``train`` and
``decode``, each a dataclass whose fields are declared with :func:`captioner.core.settings.setting` (default, meaning,
type, allowed values or bounds): :class:`RunConfig` and :class:`TrainConfig` here, the others in
:class:`~captioner.data.config.DataConfig`, :class:`~captioner.models.encoder.EncoderConfig`,
:class:`~captioner.objectives.losses.LossConfig`, :class:`~captioner.decoding.search.DecodeConfig` and each registered
decoder's config (:data:`captioner.models.captioner.DECODERS`). Code reads attributes (``config.train.epochs``).

A YAML file or an override may set only keys that exist (a typo is an error naming the key and the closest known
one), and every value is checked against its setting before anything runs; each section's ``check()`` then holds
the settings that depend on one another. Overrides are ``section.key=value``, the value parsed as YAML
(``model.lstm.attention_dim=256``). Older flat keys (``model.*``, ``train.label_smoothing``) are translated on
reading by :func:`translate_legacy`. A checkpoint keeps the resolved config as a plain dict (:meth:`Config.to_dict`),
read back by :func:`complete`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from captioner.core.devices import parse_device
from captioner.core.files import write_file
from captioner.core.settings import allowed, check_settings, check_value, default_of, kind_of, setting, settings_of
from captioner.data.config import DataConfig
from captioner.decoding.search import DecodeConfig
from captioner.errors import CaptionerError
from captioner.models.captioner import DECODERS, ModelConfig
from captioner.models.encoder import EncoderConfig
from captioner.objectives.losses import LossConfig

log = logging.getLogger(__name__)
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)     # libyaml's faster parser where PyYAML has it

VALIDATION_METRICS = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr")
"""The scores validation computes after each epoch (no Java: METEOR is left to the final evaluation)."""


@dataclass
class RunConfig:
    """The ``run`` section: where a run writes and on what it runs."""

    out: str = setting("runs/default", "run directory: checkpoints, metrics.jsonl, config.yaml", affects_results=False)
    seed: int = setting(0, "seeds Python and torch; data order depends only on it and the epoch", minimum=0)
    device: str = setting("auto", "auto | cpu | cuda | cuda:N", affects_results=False)

    def check(self) -> None:
        check_settings(self, "run")
        if self.device != "auto":
            parse_device(self.device)


@dataclass
class TrainConfig:
    """The ``train`` section: optimisation, validation, checkpoints, logging and the objective."""

    epochs: int = setting(20, "passes over the training captions", minimum=1)
    batch_size: int = setting(64, "captions per step (the global batch under torchrun)", minimum=1)
    lr: float = setting(4e-4, "Adam learning rate of the decoder", minimum=0)
    encoder_lr: float = setting(1e-4, "of the fine-tuned encoder blocks", minimum=0)
    weight_decay: float = setting(0.0, "Adam L2 penalty", minimum=0)
    grad_clip: float = setting(5.0, "clip the gradient norm to this; 0 = no clipping", minimum=0)
    lr_schedule: str = setting(
        "none", "none | step | cosine (to 0 at the run's end, or at scst_after_epoch) | rsqrt (per step, after the "
        "warm-up) | plateau (times lr_gamma after lr_patience epochs without a train.metric gain)",
        choices=("none", "step", "cosine", "rsqrt", "plateau"))
    warmup_steps: int = setting(0, "linear warm-up of the learning rate over this many steps", minimum=0)
    lr_step_epochs: int = setting(10, "lr_schedule step: decay every this many epochs", minimum=1)
    lr_gamma: float = setting(0.5, "lr_schedule step or plateau: by this factor", minimum=0)
    lr_patience: int = setting(2, "lr_schedule plateau: epochs without a train.metric gain before each decay",
                               minimum=1)
    ema_decay: float = setting(
        0.0, "validate, keep in best.pt and decode an exponential moving average of the weights, updated after every "
        "step with this decay (shorter over the first steps: (1 + n) / (10 + n) at update n); the optimizer steps the "
        "weights themselves. 0 = off", minimum=0, below=1)
    early_stopping: int = setting(5, "epochs without improvement of train.metric; 0 = never stop early", minimum=0)
    metric: str = setting("CIDEr", "the validation score that picks best.pt and early stopping",
                          choices=VALIDATION_METRICS)
    val_beam: int = setting(1, "beam size for validation decoding (1 = greedy)", minimum=1)
    val_max_images: int = setting(1000, "validation decodes at most this many images", minimum=1)
    checkpoint_every: int = setting(0, "also save 'last' every N steps (0 = at epoch ends only)", minimum=0,
                                    affects_results=False)
    nonfinite: str = setting("stop", "a NaN/inf loss: stop (keeping the last good checkpoint) | skip the batch",
                             choices=("stop", "skip"))
    log_every: int = setting(50, "a metrics.jsonl line every this many steps", minimum=1, affects_results=False)
    wandb: str = setting("offline", "offline | online | disabled", choices=("offline", "online", "disabled"),
                         affects_results=False)
    wandb_project: str = setting("captioner", "the W&B project the run logs to", affects_results=False)
    wandb_entity: str | None = setting(None, "the W&B user or team; None = your default entity", affects_results=False)
    wandb_tags: list[str] = setting([], "W&B tags of the run, e.g. [coco, soft]", affects_results=False)
    amp: bool | str = setting(
        "auto", "mixed precision: auto | true | false. auto: on CUDA (bf16 where supported, else fp16 with a gradient "
        "scaler); on a CPU bf16 only where it has native bf16 and a start-up probe finds the step 1.25x faster",
        choices=(True, False, "auto"))
    compile: bool = setting(False, "torch.compile of the decoder's repeated work (LSTM step, Transformer layers)")
    channels_last: bool = setting(True, "channels-last memory format for the CNN when fine-tuning on CUDA")
    init_from: str | None = setting(
        None, "a checkpoint to start from: its weights, vocabulary, model and encoder settings", affects_results=False)
    objective: str = setting("xe", "xe: cross-entropy (the loss section) | scst: self-critical training on CIDEr-D",
                             choices=("xe", "scst"))
    scst_after_epoch: int = setting(
        0, "objective scst: at most this many epochs of cross-entropy first (fewer when train.early_stopping ends "
        "them); self-critical training then starts from the best of them, with a fresh Adam at train.scst_lr",
        minimum=0)
    scst_lr: float | None = setting(
        None, "objective scst: the learning rate of self-critical epochs, constant, with a fresh Adam at the switch "
        "from cross-entropy (None: train.lr, and from the first epoch under train.lr_schedule)", above=0)
    expectation_epochs: int = setting(
        0, "hard attention: this many epochs first in which every caption reads alpha's expectation (no location "
        "sampled: a warm start, which early stopping waits out), then model.lstm.expectation_probability; best.pt "
        "is the best epoch after them", minimum=0)
    scst_samples: int = setting(5, "objective scst: captions sampled per image", minimum=1)
    scst_batch_size: int | None = setting(
        None, "objective scst: images per self-critical step, each sampled scst_samples times (the global batch "
        "under torchrun; None: train.batch_size)", minimum=1)
    scst_baseline: str = setting(
        "mean", "mean: of the image's other samples (Luo 2020) | greedy: its greedy caption's reward",
        choices=("mean", "greedy"))
    scst_temperature: float = setting(1.0, "objective scst: sampling temperature", above=0)
    scst_bleu_weight: float = setting(0.0, "objective scst: reward = CIDEr-D + this * BLEU-4", minimum=0)
    scst_count_end: bool = setting(True, "objective scst: <end> counts as a word in the reward, so captions learn to stop")
    scst_xe_weight: float = setting(
        0.0, "objective scst: plus this times the cross-entropy (the loss section's) of one reference caption per "
        "image, drawn at each step, which holds the policy near the human captions (a mixed objective)", minimum=0)
    scst_dropout: bool = setting(
        True, "objective scst: captions are sampled with the decoder's dropout on, as in training (false: off, so "
        "that the policy sampled and reinforced is the one that decodes)")
    scst_patience: int | None = setting(
        None, "objective scst: self-critical epochs in a row without a gain over the best self-critical epoch so far "
        "that end the run (None: train.early_stopping); the first always counts, so that SCST may dip below its "
        "cross-entropy start before it climbs past it", minimum=1)

    trainable: str = setting(
        "all", "all: every parameter of the decoder (and the fine-tuned encoder blocks) | output: the decoder's output "
        "layer alone (out_words, L_o; a Transformer's, tied to its word embedding, is untied from it), the rest frozen",
        choices=("all", "output"))
    product_weight: float = setting(
        0.0, "objective xe: the cross-entropy of the product of experts of this model and its frozen start "
        "(train.init_from), the start's logits times this weight added to the model's; what it learns is what its "
        "start under-predicts (Honda et al. 2023 after SCST, with train.trainable output: 0.1). Validation and "
        "decoding use the model alone. 0 = off", minimum=0)

    def check(self) -> None:
        check_settings(self, "train")
        if self.product_weight and self.objective != "xe":
            raise CaptionerError("train.product_weight is a cross-entropy term: it needs train.objective xe")
        if self.objective == "scst" and self.scst_baseline == "mean" and self.scst_samples < 2:
            raise CaptionerError("train.scst_baseline mean needs train.scst_samples of at least 2 (the other samples "
                                 f"of an image are its baseline), got {self.scst_samples}")


SECTIONS = {"run": RunConfig, "data": DataConfig, "encoder": EncoderConfig, "loss": LossConfig,
            "train": TrainConfig, "decode": DecodeConfig}
"""The section dataclasses by name; ``model`` is :class:`ModelConfig` (one section per registered decoder)."""
ORDER = ("run", "data", "encoder", "model", "loss", "train", "decode")


@dataclass
class Config:
    """A resolved config: one typed object per section."""

    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    encoder: EncoderConfig = dataclasses.field(default_factory=EncoderConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)

    def to_dict(self) -> dict:
        """The config as nested plain data, in section order: what ``config.yaml`` and a checkpoint hold."""
        def plain(section) -> dict:
            return {name: copy.deepcopy(getattr(section, name)) for name in settings_of(type(section))}

        out = {}
        for name in ORDER:
            if name == "model":
                out["model"] = {"decoder": self.model.decoder,
                                **{d: plain(section) for d, section in self.model.sections.items()}}
            else:
                out[name] = plain(getattr(self, name))
        return out

    @classmethod
    def from_dict(cls, tree: dict) -> "Config":
        """The config that nested plain data in today's layout describes (its values already checked); settings it
        lacks take their defaults, and keys no section knows are left out."""
        def section(kind, values: dict):
            known = settings_of(kind)
            return kind(**{k: copy.deepcopy(v) for k, v in (values or {}).items() if k in known})

        model = tree.get("model") or {}
        decoders = {name: section(entry.config, model.get(name)) for name, entry in DECODERS.items()}
        return cls(**{name: section(kind, tree.get(name)) for name, kind in SECTIONS.items()},
                   model=ModelConfig(model.get("decoder", "lstm"), **decoders))

    def check(self) -> "Config":
        """Hold the settings that depend on one another (each section's ``check``); returns the config."""
        for name in ORDER:
            getattr(self, name).check()
        lstm = self.model.lstm
        if (self.model.decoder == "lstm" and lstm.samples_locations and self.loss.hard_baseline == "caption"
                and lstm.location_samples < 2):
            raise CaptionerError("loss.hard_baseline=caption compares a caption's location samples with one "
                                 "another: set model.lstm.location_samples to 2 or more")
        return self


def defaults() -> dict:
    """Every setting with its default, as one nested dict (a fresh copy)."""
    return Config().to_dict()


def _section_of(dotted: str):
    """``(section class, setting name)`` of a dotted setting name, or None for ``model.decoder`` and section names."""
    parts = dotted.split(".")
    if parts[0] == "model":
        if len(parts) == 3 and parts[1] in DECODERS:
            return DECODERS[parts[1]].config, parts[2]
        return None
    if len(parts) == 2 and parts[0] in SECTIONS:
        return SECTIONS[parts[0]], parts[1]
    return None


def _unknown(key: str, where: str, base: dict, prefix: str) -> CaptionerError:
    dotted = prefix + key
    known = list(_flat_names())
    leaf = dotted.rsplit(".", 1)[-1]
    same_leaf = [k for k in known if k.rsplit(".", 1)[-1] == leaf and k != dotted]
    close = same_leaf or difflib.get_close_matches(dotted, known, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else f" (known here: {', '.join(sorted(base))})"
    return CaptionerError(f"{where}: unknown setting '{dotted}'{hint}")


def _is_section(dotted: str) -> bool:
    return dotted in SECTIONS or dotted == "model" or dotted.startswith("model.") and dotted[6:] in DECODERS


def _merge(base: dict, update: dict, where: str, prefix: str = "") -> dict:
    """Merge ``update`` into ``base`` (nested plain data) in place, each value checked against its setting; a key
    ``base`` lacks is an error."""
    for key, value in update.items():
        dotted = prefix + key
        if key not in base:
            raise _unknown(key, where, base, prefix)
        if _is_section(dotted):
            if not isinstance(value, dict):
                raise CaptionerError(f"{where}: '{dotted}' is a section of settings, not a value")
            _merge(base[key], value, where, f"{dotted}.")
        else:
            base[key] = _checked(dotted, value, where)
    return base


def _checked(dotted: str, value, where: str):
    """``value`` for setting ``dotted`` if that setting allows it (see :func:`captioner.core.settings.check_value`),
    else a :class:`~captioner.errors.CaptionerError` naming ``where``, the setting and the value."""
    if dotted == "model.decoder":
        if value not in DECODERS:
            raise CaptionerError(f"{where}: model.decoder must be one of {', '.join(DECODERS)}, got {value!r}")
        return value
    section, name = _section_of(dotted)
    return check_value(section, name, value, where, dotted)


def _flat_names() -> list[str]:
    """Every setting's dotted name."""
    names = ["model.decoder"]
    for name, kind in SECTIONS.items():
        names += [f"{name}.{key}" for key in settings_of(kind)]
    for name, entry in DECODERS.items():
        names += [f"model.{name}.{key}" for key in settings_of(entry.config)]
    return names


def parse_override(text: str) -> dict:
    """``"model.lstm.attention_dim=256"`` -> ``{"model": {"lstm": {"attention_dim": 256}}}``."""
    if "=" not in text:
        raise CaptionerError(f"override '{text}': expected section.key=value")
    dotted, raw = text.split("=", 1)
    try:
        value = yaml.load(raw, Loader=YAML_LOADER) if raw != "" else None
    except yaml.YAMLError as err:
        raise CaptionerError(f"override '{text}': value is not valid YAML ({err.problem})") from None
    nested: dict = value
    for key in reversed(dotted.strip().split(".")):
        nested = {key: nested}
    return nested


def apply_overrides(config: Config, overrides: Sequence[str]) -> Config:
    """A new config: ``config`` with ``overrides`` applied in order (later wins), each checked; unknown keys are
    errors."""
    if not overrides:
        return config
    tree = config.to_dict()
    for text in overrides:
        _merge(tree, parse_override(text), f"override '{text}'")
    return Config.from_dict(tree).check()


RECIPE_DIR = Path(__file__).resolve().parent / "configs"
"""The recipes that ship with the package (``captioner config --list``): the demo's runs and the COCO and
Flickr8k ones, each a YAML config whose comments say what it is for."""


def recipes() -> dict[str, Path]:
    """The packaged recipes by name (the file name without ``.yaml``), sorted."""
    return {path.stem: path for path in sorted(RECIPE_DIR.glob("*.yaml"))}


def _outside_markup(text: str, end: int) -> bool:
    """Whether position ``end`` of ``text`` is outside any backtick code span and any parentheses."""
    head = text[:end]
    return head.count("`") % 2 == 0 and head.count("(") <= head.count(")")


def recipe_summary(path: Path, width: int = 100) -> str:
    """The first sentence of a recipe's opening comment (what it trains; it ends at a full stop or colon outside
    parentheses and code spans), cut to ``width`` characters at a word boundary outside any backtick code span: the
    docs' recipes table renders it as Markdown, where a span cut open would swallow the cells after it."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines)
    ends = [match.start() for match in re.finditer(r"(?<=[.:])\s(?=[A-Z])", text)
            if _outside_markup(text, match.start())]
    sentence = text[: ends[0] if ends else len(text)].rstrip(":")
    if len(sentence) <= width:
        return sentence
    cuts = [match.start() for match in re.finditer(r"\s", sentence[: width - 2])
            if sentence.count("`", 0, match.start()) % 2 == 0]
    head = sentence[: cuts[-1]] if cuts else sentence[: width - 3].replace("`", "")
    return head.rstrip(" ,;:") + "..."


def config_file(path: str | Path) -> Path:
    """The YAML file a command's CONFIG names: ``path`` where it is a file, else the packaged recipe of that name
    (``coco_soft``, ``coco_soft.yaml`` or, from a clone's instructions, ``configs/coco_soft.yaml``), so that an
    installed package trains its recipes from any folder. Raises :class:`CaptionerError` naming the recipes when
    neither exists."""
    path = Path(path)
    if path.exists():
        return path
    if shipped := _recipe_named(path):
        return shipped
    raise CaptionerError(f"{path}: no such config file, and no recipe of that name (recipes: "
                         f"{', '.join(recipes())}; captioner config --list says what each is)")


def _recipe_named(path: Path) -> Path | None:
    """The packaged recipe that ``path`` names (``coco_soft``, ``coco_soft.yaml`` or ``configs/coco_soft.yaml``),
    if any."""
    if path.parent not in (Path("."), Path("configs")):
        return None
    return recipes().get(path.name.removesuffix(".yaml"))


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Defaults, then the YAML file (a path, or a packaged recipe's name: :func:`config_file`) over the config it
    ``extends``, if any, then the overrides (later wins), every value checked as it is read, then the settings that
    depend on one another. Returns a fresh :class:`Config`."""
    tree = defaults()
    if path is not None:
        for loaded, where in _config_chain(config_file(path)):
            _merge(tree, loaded, where)
    for text in overrides:
        _merge(tree, parse_override(text), f"override '{text}'")
    return Config.from_dict(tree).check()


def _config_chain(path: Path, below: tuple[Path, ...] = ()) -> list[tuple[dict, str]]:
    """The settings of the config file ``path`` and of every config it ``extends``, the most basic first, each with
    the file it came from. ``extends: NAME`` names a YAML file beside ``path`` (with or without ``.yaml``), else a
    packaged recipe (``NAME`` or ``configs/NAME`` as :func:`config_file` reads it), so that a file of one's own named
    like a recipe can extend that recipe."""
    below = (*below, path.resolve())
    loaded = _read_yaml(path)
    chain = []
    if "extends" in loaded:
        base = loaded.pop("extends")
        if not isinstance(base, str) or not base:
            raise CaptionerError(f"{path}: 'extends' names one config file or recipe, got {base!r}")
        candidates = [p for p in (path.parent / base, path.parent / f"{base}.yaml", _recipe_named(Path(base)))
                      if p is not None and p.is_file()]
        found = next((p for p in candidates if p.resolve() not in below), None)
        if found is None and candidates:
            cycle = " -> ".join(str(p) for p in (*below, candidates[0].resolve()))
            raise CaptionerError(f"{path}: its 'extends' form a cycle ({cycle})")
        if found is None:
            raise CaptionerError(f"{path}: extends {base!r}, which is neither a file beside it nor a recipe "
                                 "(captioner config --list)")
        chain = _config_chain(found, below)
    # old flat model settings go to this file's decoder, else the nearest base's
    decoders = [model.get("decoder") for settings, _ in [*chain, (loaded, "")]
                if isinstance(model := settings.get("model"), dict)]
    loaded, moved = translate_legacy(loaded, next((d for d in reversed(decoders) if d), None))
    if moved:
        log.warning("%s: settings in their old places were read as %s", path, ", ".join(moved))
    return [*chain, (loaded, str(path))]


def _read_yaml(path: Path) -> dict:
    """A config file's mapping of sections, or a :class:`CaptionerError` naming the file and what is wrong."""
    try:
        loaded = yaml.load(path.read_text(), Loader=YAML_LOADER) or {}
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
    return loaded


# Loss settings that used to sit in ``model``, and the one that sat in ``train``.
LEGACY_LOSS_KEYS = ("doubly_stochastic", "doubly_stochastic_scale", "entropy_weight", "baseline_decay", "hard_reward")


def translate_legacy(config: dict, decoder: str | None = None) -> tuple[dict, list[str]]:
    """A config written before decoders had sections of their own, in today's layout: flat ``model.KEY``
    moves to ``model.<decoder>.KEY`` (for keys that several decoders have: ``decoder``, the config's own
    ``model.decoder`` where that is not given, else the LSTM; other keys go to the decoder that has them), loss
    settings to ``loss``. Returns the new config and the moved keys' new names. Keys no decoder knows stay where
    they are (and are reported as unknown later)."""
    config = copy.deepcopy(config)
    model, moved = config.get("model"), []
    if not isinstance(model, dict):
        return config, moved
    decoder = decoder or model.get("decoder", "lstm")
    owners = {name: set(settings_of(entry.config)) for name, entry in DECODERS.items()}
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


def complete(config: dict) -> Config:
    """A saved config (a checkpoint's plain dict) as a :class:`Config` in today's layout, with today's defaults for
    settings added since it was written, so older checkpoints keep loading; its own values win, and settings
    no longer known are left out."""
    return Config.from_dict(translate_legacy(config)[0])


def save_config(config: Config, path: str | Path) -> None:
    write_file(path, yaml.safe_dump(config.to_dict(), sort_keys=False))


def config_reference() -> str:
    """Every setting with its default, what it allows and its meaning, as one Markdown table per section
    (``model`` per decoder), generated from the section classes: what ``captioner config --reference`` prints and
    the docs' configuration page shows."""
    def cell(text: str) -> str:     # a token such as <end> as code: as HTML, a browser would hide it
        return re.sub(r"(<[\w.]+>)", r"`\1`", text).replace("|", "\\|")

    def rows(kind, prefix: str) -> list[str]:
        out = []
        for key, field in settings_of(kind).items():
            default = yaml.safe_dump(default_of(field), default_flow_style=True).strip().removesuffix("...").strip()
            out.append(f"| `{prefix}{key}` | `{default}` | {cell(allowed(field, kind_of(kind, key)))} | "
                       f"{cell(field.metadata['meaning'])} |")
        return out

    def table(title: str, body: list[str]) -> list[str]:
        return [f"**{title}**", "", "| setting | default | allowed | meaning |", "|---|---|---|---|", *body, ""]

    lines = []
    for name in ORDER:
        if name == "model":
            lines += table("model", [f"| `model.decoder` | `lstm` | {cell(' | '.join(DECODERS))} | "
                                     "the decoder; its settings: `model.<decoder>.*` |"])
            for decoder, entry in DECODERS.items():
                lines += table(f"model.{decoder}", rows(entry.config, f"model.{decoder}."))
        else:
            lines += table(name, rows(SECTIONS[name], f"{name}."))
    return "\n".join(lines).rstrip() + "\n"
