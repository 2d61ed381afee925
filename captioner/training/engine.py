"""The training engine: ``train`` (the whole run, resumable), ``train_one_epoch`` and ``validate``.

A run directory holds ``config.yaml`` (the resolved config), ``last.pt`` and ``best.pt`` (see
:mod:`captioner.checkpoint`; an SCST run also keeps its cross-entropy start, ``cross_entropy.pt``),
``metrics.jsonl`` (one JSON object per log line) and the wandb folder when wandb is on. ``train(..., resume=True)``
continues from ``last.pt`` exactly where an uninterrupted run would be: same data order, same random state, same
optimizer and loss state.

Everything the steps of a run share lives in a :class:`Run`; what changes from step to step (and is saved)
in a :class:`TrainState`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioner.checkpoint import build_model, data_record, load_checkpoint, model_and_loss_states, save_checkpoint
from captioner.config import Config, complete, save_config
from captioner.core.console import progress_bar
from captioner.core.devices import describe_device
from captioner.core.files import atomic_write
from captioner.core.randomness import rng_state, seed_everything, set_rng_state
from captioner.data.dataset import (
    CaptionDataset,
    EpochSampler,
    collate,
    make_dataset,
    visual_inputs,
)
from captioner.data.feature_cache import cache_is_complete, check_cache_matches, mirrored_folder
from captioner.data.readers import available_splits, read_splits
from captioner.data.vocabulary import Vocabulary, training_vocabulary, with_training_counts
from captioner.decoding.search import DecodeConfig
from captioner.errors import CaptionerError
from captioner.evaluation.caption_metrics import score_captions
from captioner.evaluation.generate import caption_texts, generate_captions
from captioner.models.captioner import Captioner, ModelConfig, compile_decoder
from captioner.objectives.losses import build_loss
from captioner.objectives.scst import SelfCritical, metric_reward
from captioner.training.distributed import (
    World,
    all_sum,
    barrier,
    merge_dicts,
    setup,
    teardown,
)
from captioner.training.averaging import WeightAverage
from captioner.training.features import cache_features
from captioner.training.precision import Precision, amp_dtype, autocast, choose_precision, precision_name
from captioner.training.run_io import GracefulStop, MetricsLogger
from captioner.version import __version__

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Where a run stands; saved in every checkpoint as ``progress``."""

    epoch: int = 0                  # epochs finished
    step: int = 0                   # optimizer steps taken
    batch_in_epoch: int = 0         # batches of the current epoch consumed (a resumed run starts after them)
    best: float = float("-inf")     # best validation score of train.metric so far (best.pt's)
    stage_best: float = float("-inf")   # the best of the current stage's epochs (cross-entropy, or SCST's)
    stale: int = 0                  # epochs since stage_best last improved
    train_seconds: float = 0.0      # training time of the whole run, resumed parts included
    words_per_s: float | None = None
    epoch_seconds: float | None = None  # the current or last epoch's training time so far, validation apart
    amp: bool | None = None         # train.amp as decided when the run started (None: not yet)
    precision: str | None = None    # what that means on the run's device: float32, bf16 or fp16 (None: not yet)
    scst_from: int | None = None    # the epoch (from 0) self-critical training began at (None: not yet)
    train_images: int = 0           # the training split's images and captions (what a model card states)
    train_captions: int = 0
    skipped_images: list[str] = field(default_factory=list)


@dataclass
class Run:
    """Everything the steps of one training run share."""

    config: Config
    world: World
    device: torch.device
    dir: Path
    vocab: Vocabulary
    model: Captioner
    net: nn.Module                  # what runs the forward pass: the model, wrapped for DDP and/or compiled
    loss: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    loaders: dict[str, DataLoader]  # per objective: "xe" over (image, caption) pairs, "scst" over images
    val_set: CaptionDataset
    self_critical: SelfCritical | None
    start: Captioner | None         # train.product_weight: the frozen start, the model's partner in the product
    average: WeightAverage | None   # train.ema_decay: the moving average of the weights
    logger: MetricsLogger
    rank_batch: int
    started: float = field(default_factory=time.perf_counter)
    seconds_before: float = 0.0     # training time of the earlier parts of a resumed run
    precision: Precision = Precision(False, "not decided yet")
    trained_on: dict | None = None  # the training data's name and kind, as every checkpoint records it

    def objective(self, state: "TrainState") -> str:
        """``xe`` or ``scst``: what the epoch after ``state.epoch`` finished ones optimises."""
        return "scst" if state.scst_from is not None and state.epoch >= state.scst_from else "xe"

    def averaged(self):
        """A block in which the model holds its weights' moving average (``train.ema_decay``), if it keeps one."""
        return self.average.applied() if self.average is not None else nullcontext()

    def save(self, state: TrainState, name: str = "last") -> None:
        """Write ``{name}.pt`` (rank 0 only), the training time so far included. Its ``model`` is the model that
        validates, the weights' moving average when the run keeps one; the weights themselves are then ``trained``
        (what a resumed run steps on from)."""
        state.train_seconds = self.seconds_before + time.perf_counter() - self.started
        if not self.world.is_main:
            return
        payload = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                   "loss": self.loss.state_dict(), "progress": asdict(state), "rng": rng_state(),
                   "vocab": self.vocab.to_dict(), "config": self.config.to_dict(), "captioner_version": __version__,
                   "trained_on": self.trained_on}
        if self.average is not None:
            payload["trained"] = {"weights": {name: p.detach().clone() for name, p in self.model.named_parameters()
                                              if p.requires_grad},
                                  "average_updates": self.average.updates}
        with self.averaged():
            save_checkpoint({"model": self.model.state_dict(), **payload}, self.dir / f"{name}.pt")


def prepare_run_dir(run_dir: Path, *, resume: bool, overwrite: bool, world: World) -> None:
    """Refuse to resume nothing or to replace a run silently; create the folder (rank 0). Nothing is removed
    yet: see :func:`clear_replaced_run`."""
    last = run_dir / "last.pt"
    if resume and not last.exists():
        raise CaptionerError(f"{last}: nothing to resume")
    if not resume and not overwrite and (last.exists() or (run_dir / "best.pt").exists()):
        raise CaptionerError(f"{run_dir}: already holds a run; pass --resume to continue it or --overwrite to replace it")
    if world.is_main:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CaptionerError(f"{run_dir}: cannot create the run folder ({err.strerror or err})") from None
    barrier(world)


REPLACED_RUN_FILES = ("last.pt", "best.pt", "cross_entropy.pt", "metrics.jsonl", "captions_*.json", "scores_*.json",
                      "nbest_*.json", "grounding_*.json", "grounding_references_*.json")
"""What a new run removes from its folder: the checkpoints and metrics of the run it replaces (or of one
that failed before its first checkpoint) and the evaluation files that describe that run's model."""


def clear_replaced_run(run_dir: Path, world: World) -> None:
    """Called once a new (not resumed) run's data and model are built, so that a missing file or a bad
    setting leaves the run it would replace as it was."""
    if world.is_main:
        for pattern in REPLACED_RUN_FILES:
            for path in run_dir.glob(pattern):
                path.unlink(missing_ok=True)
    barrier(world)


def _differences(saved: dict, config: dict, prefix: str) -> list[str]:
    keys = sorted(set(saved) | set(config))
    out = []
    for key in keys:
        a, b = saved.get(key), config.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(prefix + key)
    return out


def resumable_checkpoint(config: Config, path: Path) -> dict:
    """``path``'s checkpoint, after checking that it trains the same model on the same encoder. Other settings
    may change (``train.epochs`` to train on, say): each one that differs from the run's is logged, with both values,
    since the resumed run trains by the config given, not by the one it started with."""
    checkpoint = load_checkpoint(path)
    saved, current = complete(checkpoint["config"]).to_dict(), config.to_dict()
    for section in ("model", "encoder"):
        changed = _differences(saved[section], current[section], f"{section}.")
        if changed:
            raise CaptionerError(f"{path}: cannot resume with a different {section} section (changed: {', '.join(changed)})")
    changed = [name for name in _differences(saved, current, "")
               if not name.startswith(("model.", "encoder.")) and name != "run.out"]
    if changed:
        log.warning("resuming %s with settings that differ from the run's: %s", path, ", ".join(
            f"{name} {_setting(saved, name)!r} -> {_setting(current, name)!r}" for name in changed))
    return checkpoint


def _setting(config: dict, name: str):
    """The value of ``section.key[.key]`` in a config dict (None where absent)."""
    for key in name.split("."):
        config = config.get(key) if isinstance(config, dict) else None
    return config


def rank_batch_size(config: Config, world: World, objective: str = "xe") -> int:
    """This rank's share of the global batch of ``objective`` (``train.batch_size``, or for ``scst``
    ``train.scst_batch_size`` where set), which must split evenly over the processes."""
    train = config.train
    name, batch = (("scst_batch_size", train.scst_batch_size) if objective == "scst" and train.scst_batch_size
                   else ("batch_size", train.batch_size))
    if batch % world.size:
        raise CaptionerError(f"train.{name}={batch} is the global batch: it must split evenly over "
                             f"{world.size} processes")
    return batch // world.size


def make_optimizer(model, config: Config) -> torch.optim.Optimizer:
    """Adam over the decoder (and the fine-tuned encoder blocks), in its fused form: one kernel for every
    parameter instead of a handful of element-wise passes each (on the CPU too)."""
    train = config.train
    groups = [{"params": [p for p in model.decoder.parameters() if p.requires_grad], "lr": train.lr}]
    encoder_params = [p for p in model.encoder.parameters() if p.requires_grad]
    if encoder_params and not config.data.features:
        groups.append({"params": encoder_params, "lr": train.encoder_lr})
    return torch.optim.Adam(groups, weight_decay=train.weight_decay, fused=True)


def make_scheduler(optimizer, config: Config, steps_per_epoch: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Per-step learning-rate factor: a linear warm-up over ``train.warmup_steps``, then ``none`` (constant),
    ``step`` (times ``lr_gamma`` every ``lr_step_epochs``), ``cosine`` (to 0 at the last step: of the run, or of its
    cross-entropy epochs where ``train.scst_after_epoch`` ends them, SCST then training at a constant rate), ``rsqrt``
    (``sqrt(warmup_steps / step)``, the Transformer's inverse-square-root decay) or ``plateau`` (constant here: the
    epochs' ends decay it, :func:`decay_on_plateau`)."""
    train = config.train
    kind, warmup = train.lr_schedule, train.warmup_steps
    epochs = train.epochs
    if train.objective == "scst" and train.scst_after_epoch:
        epochs = min(epochs, train.scst_after_epoch)
    total = max(1, epochs * steps_per_epoch)
    decays = {
        "none": lambda step: 1.0,
        "step": lambda step: train.lr_gamma ** (step // (steps_per_epoch * train.lr_step_epochs)),
        "cosine": lambda step: 0.5 * (1 + math.cos(math.pi * min(step, total) / total)),
        "rsqrt": lambda step: math.sqrt(max(warmup, 1) / max(step + 1, warmup, 1)),
        "plateau": lambda step: 1.0,
    }
    decay = decays[kind]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup if warmup else 1.0) * decay(step))


def decay_on_plateau(run: "Run", state: "TrainState") -> None:
    """``train.lr_schedule=plateau``: every ``train.lr_patience`` cross-entropy epochs in a row without a gain, the
    learning rates (the scheduler's base rates, which its checkpoint keeps) times ``train.lr_gamma``. Self-critical
    epochs keep their rate."""
    train = run.config.train
    if (train.lr_schedule != "plateau" or state.scst_from is not None or not state.stale
            or state.stale % train.lr_patience):
        return
    run.scheduler.base_lrs = [lr * train.lr_gamma for lr in run.scheduler.base_lrs]
    for group, lr in zip(run.optimizer.param_groups, run.scheduler.get_last_lr()):
        group["lr"] = lr * train.lr_gamma
    log.info("no %s gain for %d epochs: learning rate %.3g", train.metric, state.stale,
             run.optimizer.param_groups[0]["lr"])


def self_critical_optimizer(run: "Run") -> None:
    """The optimizer of self-critical training after cross-entropy: a fresh Adam at ``train.scst_lr`` (the
    encoder's rate scaled alike), constant."""
    train = run.config.train
    scale = (train.scst_lr or train.lr) / train.lr if train.lr else 1.0
    config = dataclasses.replace(run.config, train=dataclasses.replace(
        train, lr=train.lr * scale, encoder_lr=train.encoder_lr * scale))
    run.optimizer = make_optimizer(run.model, config)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda step: 1.0)


def has_self_critical_optimizer(config: Config, state: "TrainState") -> bool:
    """Whether self-critical epochs run with :func:`self_critical_optimizer`: after a switch from cross-entropy,
    and from the first epoch where ``train.scst_lr`` is set (else ``train.lr`` under ``train.lr_schedule``)."""
    return state.scst_from is not None and (state.scst_from > 0 or config.train.scst_lr is not None)


def begin_self_critical(run: "Run", state: "TrainState") -> None:
    """End the cross-entropy epochs of an SCST run: back to their best weights (``best.pt``, kept as
    ``cross_entropy.pt``: the start that SCST's gain is measured against), and a fresh optimizer
    (:func:`self_critical_optimizer`); ``last.pt`` then resumes into self-critical training."""
    barrier(run.world)
    best = run.dir / "best.pt"
    if best.exists():
        run.model.load_state_dict(model_and_loss_states(load_checkpoint(best))[0])
        if run.world.is_main:
            atomic_write(run.dir / "cross_entropy.pt", lambda handle: handle.write(best.read_bytes()))
    if run.average is not None:     # SCST averages its own steps, from its start
        run.average.reset()
    self_critical_optimizer(run)
    state.scst_from, state.stage_best, state.stale = state.epoch, float("-inf"), 0
    tqdm.write(f"self-critical training from epoch {state.epoch + 1}, from the best cross-entropy epoch "
               f"({run.config.train.metric} {state.best:.3f}), learning rate {run.optimizer.param_groups[0]['lr']:.3g}")
    run.save(state)


def cross_entropy_ends(config: Config, state: "TrainState") -> bool:
    """True when an SCST run's cross-entropy epochs are over: ``train.scst_after_epoch`` of them, or fewer when
    ``train.early_stopping`` epochs in a row brought no gain."""
    train = config.train
    return (train.objective == "scst" and state.scst_from is None
            and (state.epoch >= train.scst_after_epoch or stopped_early(state, config)))


def wrap_model(model: Captioner, world: World, device: torch.device) -> nn.Module:
    """The module that runs the forward pass: DistributedDataParallel across ranks, else the model itself."""
    if world.distributed:
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


def epoch_loader(dataset: CaptionDataset, config: Config, world: World, device: torch.device, rank_batch: int,
                 bucket: bool, mirror: float = 0.0) -> DataLoader:
    """A loader whose :class:`EpochSampler` gives every epoch its own order (``loader.sampler.set_epoch``) and
    mirrors each item with chance ``mirror``."""
    data = config.data
    sampler = EpochSampler(len(dataset), seed=config.run.seed, rank=world.rank, world_size=world.size,
                           lengths=[dataset.caption_length(i) for i in range(len(dataset))],
                           bucket_batch=config.train.batch_size if bucket else 0, mirror=mirror)
    workers = data.num_workers
    return DataLoader(dataset, batch_size=rank_batch, sampler=sampler, collate_fn=collate, num_workers=workers,
                      pin_memory=device.type == "cuda", persistent_workers=workers > 0,
                      generator=torch.Generator())  # keeps the global random state untouched


def build_run(config: Config, world: World, device: torch.device, checkpoint: dict | None,
              initial: dict | None = None) -> Run:
    """Data, model, loss, optimizer and loaders of a run: new, or starting from the weights and vocabulary of
    ``initial`` (``train.init_from``); about to resume from ``checkpoint`` either way."""
    data, train = config.data, config.train
    rank_batch = rank_batch_size(config, world)
    by_split = read_splits(data, ("train", "val"))     # a Karpathy file parsed once for both
    train_records, val_records = by_split["train"], by_split["val"]
    carried = checkpoint or initial
    # a carried vocabulary as saved, its counts and endings counted where it was saved before they were kept
    vocab = (with_training_counts(Vocabulary.from_dict(carried["vocab"]), data, train_records) if carried
             else training_vocabulary(data, train_records))
    model = build_model(config, len(vocab), pretrained=carried is None)
    if initial is not None:
        model.load_state_dict(model_and_loss_states(initial)[0])
    check_cache_matches(data.features, config.encoder)
    model.to(device)
    start = prepare_fine_tuning(model, config)
    if train.channels_last and device.type == "cuda":
        model.encoder.to(memory_format=torch.channels_last)
    # SCST's items stay as they are: its rewards score a sample against the photo's captions as written
    xe_set = make_dataset(data, train_records, vocab, model.encoder, pairs=True, mirrored=data.mirror > 0)
    loaders = {"xe": epoch_loader(xe_set, config, world, device, rank_batch, data.bucket_by_length, data.mirror)}
    loss = build_loss(model.decoder, config.loss).to(device)
    self_critical = None
    if train.objective == "scst":
        loaders["scst"] = epoch_loader(make_dataset(config.data, train_records, vocab, model.encoder, pairs=False), config,
                                       world, device, rank_batch_size(config, world, "scst"), bucket=False)
        self_critical = make_self_critical(config, vocab, train_records, loss)
    optimizer = make_optimizer(model, config)
    first = loaders["scst" if train.objective == "scst" and train.scst_after_epoch == 0 else "xe"]
    return Run(config=config, world=world, device=device, dir=Path(config.run.out), vocab=vocab, model=model,
               net=wrap_model(model, world, device), loss=loss,
               optimizer=optimizer, scheduler=make_scheduler(optimizer, config, len(first)),
               scaler=torch.amp.GradScaler(device.type, enabled=train.amp is not False and amp_dtype(device) == torch.float16),
               loaders=loaders, val_set=make_dataset(config.data, val_records, vocab, model.encoder, pairs=False),
               self_critical=self_critical, start=start,
               average=WeightAverage(model, train.ema_decay) if train.ema_decay else None,
               logger=MetricsLogger(Path(config.run.out), config, resume=checkpoint is not None,
                                    enabled=world.is_main),
               rank_batch=rank_batch, trained_on=data_record(data))


def prepare_fine_tuning(model: Captioner, config: Config) -> Captioner | None:
    """What a run (and the results check's training probe) does to ``model`` before its optimizer is made: the
    parameters ``train.trainable`` freezes, frozen; returns the frozen start of ``train.product_weight``, or None."""
    start = frozen_start(model, config)
    if config.train.trainable == "output":
        train_output_layer_only(model)
    return start


def frozen_start(model: Captioner, config: Config) -> Captioner | None:
    """``train.product_weight``: a frozen copy of ``model`` as it starts (``train.init_from``'s weights), in eval
    mode (no dropout), the partner of the model in the product of experts of :func:`decoder_loss`."""
    if not config.train.product_weight:
        return None
    if model.decoder.samples_locations or getattr(model.decoder, "variational", False):
        raise CaptionerError("train.product_weight needs a decoder with one word distribution per step (soft "
                             "attention or the Transformer), not hard or variational attention")
    return copy.deepcopy(model).eval().requires_grad_(False)


def train_output_layer_only(model: Captioner) -> None:
    """``train.trainable=output``: the decoder's output layer (``out_words``) trains, every other parameter is
    frozen."""
    output = getattr(model.decoder, "out_words", None)
    if output is None:
        raise CaptionerError(f"train.trainable output: the {type(model.decoder).__name__} has no output layer "
                             "out_words")
    if any(p is output.weight for m in model.modules() if m is not output for p in m.parameters(recurse=False)):
        raise CaptionerError("train.trainable output: the output layer's weight is shared with another layer "
                             "(tied embeddings), which would train too; untie them (model.transformer."
                             "tie_embeddings false)")
    model.requires_grad_(False)
    output.requires_grad_(True)


def startup_facts(run: Run) -> list[str]:
    """What a run states when it starts: the device, the precision, the world, the data and the vocabulary."""
    train, data = run.config.train, run.config.data
    world = (f"{run.world.size} processes ({'nccl' if run.device.type == 'cuda' else 'gloo'}), global batch "
             f"{train.batch_size} = {run.rank_batch} per process" if run.world.distributed
             else f"1 process, batch {train.batch_size}")
    pairs, val = run.loaders["xe"].dataset, run.val_set
    source = (f"features cached in {data.features} ({pairs.features.grid[0]}x{pairs.features.grid[1]} regions of "
              f"{pairs.features.feature_dim})" if pairs.features is not None
              else f"images through {run.config.encoder.name} at {run.config.encoder.image_size} px")
    if data.mirror > 0:
        source += f"; each caption's photo mirrored with chance {data.mirror:g}" + (
            f" (from {pairs.mirrored.folder})" if pairs.mirrored is not None else "")
    missing = f", {len(pairs.missing)} missing from the cache and skipped" if pairs.missing else ""
    return [f"device: {describe_device(run.device)}",
            f"precision: {run.precision.describe(run.device)}; compile: {train.compile}",
            f"world: {world}",
            f"data: train {len(pairs.records):,} images, {len(pairs):,} captions{missing}; val {len(val.records):,} "
            f"images ({min(len(val.records), train.val_max_images):,} decoded per validation); {source}",
            f"vocabulary: {len(run.vocab):,} words; model: {run.config.model.decoder} decoder, "
            f"{sum(p.numel() for p in run.model.parameters() if p.requires_grad):,} trained parameters"]


def decide_precision(run: Run, state: TrainState) -> Precision:
    """``train.amp`` decided once per run (:func:`~captioner.training.precision.choose_precision`) and recorded in
    ``state``: a resumed run keeps the decision it started with; under torchrun every rank takes rank 0's."""
    if state.amp is not None:
        state.precision = precision_name(state.amp, run.device)
        return Precision(state.amp, "as decided when the run started")
    choice = None
    if run.world.is_main:
        choice = choose_precision(run.config.train.amp, run.model, run.loss, len(run.vocab), run.rank_batch,
                                  run.device)
    state.amp = all_sum([float(choice.amp) if choice else 0.0], run.world, run.device)[0] > 0
    state.precision = precision_name(state.amp, run.device)
    return choice or Precision(state.amp, "rank 0's decision")


def make_self_critical(config: Config, vocab: Vocabulary, train_records, cross_entropy) -> SelfCritical:
    """The self-critical objective: CIDEr-D (+ BLEU-4) against the training references, whose document
    frequencies are cached beside the features (or the vocabulary file, or the run); ``cross_entropy``, the run's
    loss, for ``train.scst_xe_weight``."""
    data, train = config.data, config.train
    cache = data.features or (Path(data.vocab).parent if data.vocab else config.run.out)
    reward = metric_reward({r.image_id: r.captions for r in train_records}, cache, count_end=train.scst_count_end,
                           bleu_weight=train.scst_bleu_weight)
    return self_critical_objective(config, vocab, reward, cross_entropy)


def self_critical_objective(config: Config, vocab: Vocabulary, reward, cross_entropy) -> SelfCritical:
    """The self-critical objective of ``config``'s ``train`` section with the reward function ``reward``."""
    train = config.train
    try:
        return SelfCritical(reward, vocab, samples=train.scst_samples, baseline=train.scst_baseline,
                            temperature=train.scst_temperature, max_length=config.decode.max_length,
                            suppress_unk=config.decode.suppress_unk, entropy_weight=config.loss.entropy_weight,
                            dropout=train.scst_dropout, xe_weight=train.scst_xe_weight, cross_entropy=cross_entropy)
    except ValueError as err:
        raise CaptionerError(str(err)) from None


def initial_checkpoint(config: Config) -> tuple[dict, dict | None]:
    """``train.init_from``'s checkpoint, and the config with that checkpoint's model and encoder sections (a run
    that starts from trained weights keeps their architecture and vocabulary; under ``train.trainable=output`` a
    Transformer's output layer is untied from its word embedding, so that the embedding stays frozen)."""
    path = config.train.init_from
    if not path and config.train.product_weight:
        raise CaptionerError("train.product_weight needs train.init_from: the start it is a product with")
    if not path:
        return config, None
    initial = load_checkpoint(path)
    carried = complete(initial["config"])
    old, new = carried.to_dict(), config.to_dict()
    changed = [k for section in ("model", "encoder") for k in _differences(old[section], new[section], f"{section}.")]
    if changed:
        log.info("%s: taking its model and encoder settings (%s differed)", path, ", ".join(changed))
    started = fine_tuning_model(dataclasses.replace(config, model=carried.model, encoder=carried.encoder))
    if started.model is not carried.model:
        log.info("train.trainable output: the output layer is untied from the word embedding, which stays frozen "
                 "(model.transformer.tie_embeddings false from here on)")
    return started, initial


def fine_tuning_model(config: Config) -> Config:
    """``config`` with the model a run that starts from trained weights builds: under ``train.trainable=output``, a
    Transformer's output layer untied from its word embedding, so that the embedding stays frozen (the results
    check's training probe builds it so too)."""
    model = config.model
    if config.train.trainable != "output" or model.decoder != "transformer" or not model.transformer.tie_embeddings:
        return config
    untied = dataclasses.replace(model.transformer, tie_embeddings=False)
    return dataclasses.replace(config, model=ModelConfig(model.decoder, **{**model.sections, "transformer": untied}))


def restore(run: Run, checkpoint: dict) -> TrainState:
    """Load a checkpoint's weights, optimizer, schedule, loss state and random state into ``run``."""
    model_state, loss_state = model_and_loss_states(checkpoint)
    run.model.load_state_dict(model_state)
    trained = checkpoint.get("trained")     # saved with an average: the model is the average, the weights apart
    if run.average is not None:             # the average is the saved model (saved without one: the weights)
        run.average.reset(trained["average_updates"] if trained else 0)
    if trained:
        loaded = run.model.load_state_dict(trained["weights"], strict=False)
        trainable = {name for name, p in run.model.named_parameters() if p.requires_grad}
        missing = [name for name in loaded.missing_keys if name in trainable]
        if loaded.unexpected_keys or missing:
            raise CaptionerError(f"{run.dir / 'last.pt'}: its trained weights do not match the model "
                                 f"(unexpected: {loaded.unexpected_keys[:3]}, missing: {missing[:3]})")
    if loss_state:
        run.loss.load_state_dict(loss_state)
    known = {f.name for f in fields(TrainState)}
    state = TrainState(**{k: v for k, v in checkpoint["progress"].items() if k in known})
    if "stage_best" not in checkpoint["progress"]:      # saved before each stage kept its own best
        state.stage_best = state.best if state.scst_from is None else float("-inf")
    if has_self_critical_optimizer(run.config, state):
        self_critical_optimizer(run)
    run.optimizer.load_state_dict(checkpoint["optimizer"])
    run.scheduler.load_state_dict(checkpoint["scheduler"])
    set_rng_state(checkpoint["rng"])
    run.seconds_before = state.train_seconds
    log.info("resumed %s at epoch %d, step %d", run.dir, state.epoch + 1, state.step)
    return state


def decoder_loss(run: Run, batch: dict, objective: str = "xe") -> dict[str, torch.Tensor]:
    """Forward pass and loss of one batch on this rank: cross-entropy (the ``loss`` section's) of the batch's
    captions, or the self-critical loss of captions sampled for its images."""
    channels_last = run.config.train.channels_last and run.device.type == "cuda"
    inputs = visual_inputs(batch, run.device, channels_last=channels_last)
    with autocast(run.device, run.precision.amp):
        if objective == "scst":
            references = None
            if run.config.train.scst_xe_weight:    # a reference caption per image: the batch's, or one of its image's
                references = batch["captions"] if "captions" in batch else run.loaders["scst"].dataset.random_captions(
                    batch["index"])
                references = references.to(run.device, non_blocking=True)
            return run.net(references, sequence_loss=run.self_critical, image_ids=batch["image_id"], **inputs)
        captions = batch["captions"].to(run.device, non_blocking=True)
        out = run.net(captions, **inputs)
        if run.start is not None:       # the product of experts: log p + w log p_start, up to each word's constant
            with torch.no_grad():
                start_logits = run.start(captions, **inputs).logits
            out = dataclasses.replace(out, logits=out.logits + run.config.train.product_weight * start_logits)
        return run.loss(out, captions[:, 1:])


def log_skipped_images(run: Run, state: TrainState, batch: dict) -> None:
    for message in batch["errors"]:
        if message not in state.skipped_images:  # each image once, though it comes with every caption
            state.skipped_images.append(message)
            log.warning("skipped unreadable image: %s", message)
            run.logger.log({"type": "skipped_image", "step": state.step, "error": message})


def optimizer_step(run: Run, state: TrainState, losses: dict, stop: GracefulStop) -> tuple[float, bool] | None:
    """Back-propagate and step, with the ranks agreeing on the words, non-finite losses and stop requests.
    Returns ``(global words, stop requested on some rank)``, or None when the batch was skipped.

    With several ranks each rank's loss is weighted by its share of the global batch's words, so the
    averaged gradient is that of one process over the whole global batch (exactly so for the cross-entropy)."""
    loss, world, train = losses["loss"], run.world, run.config.train
    run.optimizer.zero_grad(set_to_none=True)
    local_words = float(losses["words"])
    global_words, nonfinite_ranks, stopping_ranks = all_sum(
        [local_words, float(not torch.isfinite(loss)), float(stop.requested)], world, run.device)
    if nonfinite_ranks:
        where = f"step {state.step + 1}, epoch {state.epoch + 1}"
        if train.nonfinite != "skip":
            raise CaptionerError(f"non-finite loss ({loss.item()}) at {where}; the last good checkpoint is kept "
                                 f"(train.nonfinite=skip skips such batches instead)")
        log.warning("non-finite loss (%s) at %s: batch skipped", loss.item(), where)
        run.logger.log({"type": "skipped_batch", "step": state.step + 1, "loss": str(loss.item())})
        return None
    if world.distributed:
        loss = loss * (local_words * world.size / max(global_words, 1.0))
    run.scaler.scale(loss).backward()
    if train.grad_clip:
        run.scaler.unscale_(run.optimizer)
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), train.grad_clip)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.scheduler.step()
    if run.average is not None:
        run.average.update()
    state.step += 1
    return global_words, bool(stopping_ranks or stop.requested and not world.distributed)


def log_step(run: Run, state: TrainState, losses: dict, words_per_s: float, objective: str) -> None:
    """One metrics line: the loss and every term of it (cross-entropy, attention, reinforce, reward, ...)."""
    record = {"type": "train", "step": state.step, "epoch": state.epoch + 1, "objective": objective,
              "words_per_s": words_per_s, "lr": run.optimizer.param_groups[0]["lr"]}
    record.update({key: value.item() for key, value in losses.items() if key != "words" and value.dim() == 0})
    run.logger.log(record)


@contextmanager
def expectation_only(decoder: nn.Module, on: bool):
    """Hard attention's warm start (``train.expectation_epochs``): while ``on``, every training caption reads
    alpha's expectation, as if ``model.lstm.expectation_probability`` were 1; the decoder's settings are restored
    after."""
    settings = getattr(decoder, "config", None)
    if not (on and decoder.samples_locations):
        yield
        return
    decoder.config = dataclasses.replace(settings, expectation_probability=1.0)
    try:
        yield
    finally:
        decoder.config = settings


def train_one_epoch(run: Run, state: TrainState, stop: GracefulStop, progress: bool = True) -> bool:
    """One pass over the loader, from ``state.batch_in_epoch`` on (a progress bar on rank 0 unless ``progress``
    is False), hard attention on the expectation during its first ``train.expectation_epochs``. Returns False
    when asked to stop part-way."""
    with expectation_only(run.model.decoder, state.epoch < run.config.train.expectation_epochs):
        return _train_one_epoch(run, state, stop, progress)


def _train_one_epoch(run: Run, state: TrainState, stop: GracefulStop, progress: bool) -> bool:
    train, objective = run.config.train, run.objective(state)
    loader = run.loaders[objective]
    loader.sampler.set_epoch(state.epoch, start=state.batch_in_epoch * loader.batch_size)
    run.model.train()
    run.loss.train()
    words_seen, started = 0, time.perf_counter()
    before = (state.epoch_seconds or 0.0) if state.batch_in_epoch else 0.0     # the part before a resume
    bar = progress_bar(loader, desc=f"epoch {state.epoch + 1}/{train.epochs} ({objective})", unit="batch",
                       leave=False, show=run.world.is_main and progress, initial=state.batch_in_epoch,
                       total=state.batch_in_epoch + len(loader))
    for batch in bar:
        log_skipped_images(run, state, batch)
        state.batch_in_epoch += 1  # consumed, even if skipped below: a resumed run starts after it
        if batch["size"] == 0:
            continue
        losses = decoder_loss(run, batch, objective)
        stepped = optimizer_step(run, state, losses, stop)
        if stepped is None:
            continue
        words_seen += int(stepped[0])
        state.epoch_seconds = before + time.perf_counter() - started    # current for a save part-way through
        words_per_s = words_seen / (state.epoch_seconds - before)
        bar.set_postfix(loss=f"{losses['loss'].item():.3f}", words_s=f"{words_per_s:.0f}", refresh=False)
        if state.step % train.log_every == 0:
            log_step(run, state, losses, words_per_s, objective)
        if train.checkpoint_every and state.step % train.checkpoint_every == 0:
            run.save(state)
        if stepped[1]:
            return False
    state.epoch_seconds = before + time.perf_counter() - started
    state.words_per_s = words_seen / max(state.epoch_seconds - before, 1e-9)
    return True


def validate(model, val_set: CaptionDataset, vocab: Vocabulary, config: Config, world: World = World()) -> dict[str, float]:
    """Decode validation images (beam ``train.val_beam``) and score them: BLEU-1..4, ROUGE-L, CIDEr.
    Each rank decodes its share of the images; the captions are gathered so every rank gets the same scores."""
    train = config.train
    generations = generate_captions(model, val_set, vocab, DecodeConfig.of(config, beam=train.val_beam),
                                    batch_size=train.batch_size, max_images=train.val_max_images,
                                    shard=(world.rank, world.size))
    texts = merge_dicts(caption_texts(generations, vocab), world)
    references = {r.image_id: r.captions for r in val_set.records if r.image_id in texts}
    return score_captions(references, texts, java=False)


def end_epoch(run: Run, state: TrainState) -> bool:
    """Validate, keep the best checkpoint, save ``last``; returns False when early stopping ends the run (not
    when it ends an SCST run's cross-entropy epochs)."""
    train = run.config.train
    if state.step == 0:     # nothing learnt: a checkpoint now would be an untrained model called best.pt
        raise CaptionerError(f"{run.dir}: a whole epoch without one training step: every batch was skipped "
                             f"({len(state.skipped_images)} unreadable images, named above and in metrics.jsonl)")
    started = time.perf_counter()
    with run.averaged():
        scores = validate(run.model, run.val_set, run.vocab, run.config, run.world)
    val_seconds = time.perf_counter() - started
    state.epoch += 1
    state.batch_in_epoch = 0
    score = scores[train.metric]
    if sampling_begins(run.config, state):     # the warm epochs trained soft attention: best.pt is a hard model from here
        state.best, state.stage_best, state.stale = float("-inf"), float("-inf"), 0
        if run.world.is_main:
            tqdm.write(f"epoch {state.epoch} sampled locations after the warm start: best.pt holds the best such epoch")
    improved = score > state.best
    state.best = max(state.best, score)
    state.stage_best, state.stale = (score, 0) if score > state.stage_best else (state.stage_best, state.stale + 1)
    decay_on_plateau(run, state)
    run.logger.log({"type": "val", "step": state.step, "epoch": state.epoch, "words_per_s": state.words_per_s,
                    "epoch_seconds": state.epoch_seconds, "val_seconds": val_seconds, **scores})
    if run.world.is_main:
        tqdm.write(f"epoch {state.epoch}/{train.epochs}: " + " ".join(f"{k} {v:.3f}" for k, v in scores.items())
                   + f" | {state.words_per_s or 0:.0f} words/s | {state.epoch_seconds or 0:.0f} s training, "
                   f"{val_seconds:.0f} s validating" + (" (best)" if improved else ""))
    run.save(state)
    if improved:
        run.save(state, "best")
    if stopped_early(state, run.config) and not cross_entropy_ends(run.config, state):
        tqdm.write(f"early stop: no {train.metric} gain for {state.stale} epochs")
        return False
    return True


def warm_epochs(config: Config) -> int:
    """The epochs of hard attention's warm start (``train.expectation_epochs``; none for a model that samples no
    locations): they train soft attention."""
    samples = config.model.decoder == "lstm" and config.model.lstm.samples_locations
    return config.train.expectation_epochs if samples else 0


def sampling_begins(config: Config, state: TrainState) -> bool:
    """True at the end of the first epoch after hard attention's warm start: its validation starts the stage of
    epochs that sampled locations, whose best is ``best.pt`` (a run no longer than its warm start keeps the best warm
    epoch)."""
    warm = warm_epochs(config)
    return bool(warm) and state.epoch == warm + 1


def stopped_early(state: TrainState, config: Config) -> bool:
    """True once ``train.early_stopping`` epochs in a row brought no gain, or after the switch to self-critical
    training ``train.scst_patience`` epochs no gain over the best self-critical epoch (a resumed run that had
    stopped early trains no further); never during hard attention's warm start, which early stopping waits out."""
    train = config.train
    if state.epoch <= warm_epochs(config):
        return False
    patience = train.early_stopping
    if state.scst_from is not None and train.scst_patience is not None:
        patience = train.scst_patience
    return bool(patience) and state.stale >= patience


def prepare_feature_cache(config: Config, world: World) -> None:
    """Training from ``data.features`` that holds no cache yet, or an unfinished one: cache the encoder's
    features of the data's splits first (resumable), so that a run needs no separate ``cache-features`` step.
    Under torchrun the cache must be made beforehand (the other ranks would wait on rank 0 for hours)."""
    folder = config.data.features
    if not folder:
        return
    wanted = [(folder, available_splits(config.data), False)]
    if config.data.mirror > 0:      # the mirror cache of the train images (data.mirror)
        wanted.append((mirrored_folder(folder), ["train"], True))
    for cache, splits, mirrored in wanted:
        if cache_is_complete(cache):
            continue
        if world.distributed:
            raise CaptionerError(f"{cache}: no finished feature cache; make it before starting torchrun "
                                 f"(captioner cache-features CONFIG{' --splits train --mirrored' if mirrored else ''})")
        log.info("%s: no finished feature cache; caching the encoder's features of %s%s first (resumable)", cache,
                 ", ".join(splits), " (mirrored)" if mirrored else "")
        result = cache_features(config, splits, cache, mirrored=mirrored)
        if result["failed"]:
            log.warning("%s: %d unreadable image(s) left out (listed in failed.json)", cache, len(result["failed"]))


def train(config: Config, *, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    """Train a model as ``config`` says; returns ``{"best": score, "checkpoint": path, "train_seconds": s, ...}``
    (``stopped``: True when a signal stopped it part-way, with a resumable ``last.pt`` saved). ``progress``:
    False turns the per-batch progress bar off (the epoch lines stay).

    Under torchrun every rank calls this: ``train.batch_size`` is the global batch, split evenly over the
    ranks; rank 0 alone writes the run folder."""
    world, device = setup(config.run.device)
    try:
        return _train(config, world, device, resume=resume, overwrite=overwrite, progress=progress)
    finally:
        teardown(world)


def _train(config: Config, world: World, device: torch.device, *, resume: bool, overwrite: bool, progress: bool) -> dict:
    run_dir = Path(config.run.out)
    prepare_run_dir(run_dir, resume=resume, overwrite=overwrite, world=world)
    config, initial = initial_checkpoint(config)
    prepare_feature_cache(config, world)      # before seeding: its loader draws from the global generator
    seed_everything(config.run.seed)
    checkpoint = resumable_checkpoint(config, run_dir / "last.pt") if resume else None
    run = build_run(config, world, device, checkpoint, initial)
    if not resume:
        clear_replaced_run(run_dir, world)
    state = restore(run, checkpoint) if checkpoint else TrainState()
    if config.train.objective == "scst" and config.train.scst_after_epoch == 0:
        state.scst_from = 0     # self-critical from the first epoch (from train.init_from's weights)
        if checkpoint is None and has_self_critical_optimizer(config, state):
            self_critical_optimizer(run)
    run.precision = decide_precision(run, state)
    if config.train.compile:
        # after the precision probe, which times the eager step (compiled, its steps on one thread and both
        # precisions would compile variants the run never takes); the decoder's repeated work only, on every
        # device: torch.compile would unroll the LSTM loop of a whole model and compile it per caption length
        compile_decoder(run.model.decoder)
    state.train_images, state.train_captions = len(run.loaders["xe"].dataset.records), len(run.loaders["xe"].dataset)
    if world.is_main:
        for fact in startup_facts(run):
            log.info(fact)
        save_config(config, run_dir / "config.yaml")
    stopped = False
    try:
        with GracefulStop() as stop:
            while state.epoch < config.train.epochs:
                if cross_entropy_ends(config, state):       # after its last epoch, or resumed there
                    begin_self_critical(run, state)
                elif stopped_early(state, config):    # a resumed run that had stopped early stays stopped
                    break
                if not train_one_epoch(run, state, stop, progress):
                    run.save(state)
                    stopped = True
                    log.warning("saved %s; continue with --resume", run_dir / "last.pt")
                    break
                if not end_epoch(run, state):
                    break
    finally:
        run.logger.close()
    state.train_seconds = run.seconds_before + time.perf_counter() - run.started
    best = run_dir / "best.pt"
    return {"best": state.best, "metric": config.train.metric, "epochs": state.epoch, "step": state.step,
            "train_seconds": state.train_seconds, "stopped": stopped,
            "checkpoint": str(best if best.exists() else run_dir / "last.pt"), "run_dir": str(run_dir),
            "words_per_s": state.words_per_s, "skipped_images": len(state.skipped_images)}
