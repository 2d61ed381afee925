"""The training engine: ``train_one_epoch``, ``validate`` and ``train`` (the whole run, resumable).

A run directory holds ``config.yaml`` (the resolved config), ``last.pt`` and ``best.pt`` (see
:mod:`captioner.training.checkpoint`), ``metrics.jsonl`` (one JSON object per log line) and the
wandb folder when wandb is on. ``train(..., resume=True)`` continues from ``last.pt`` exactly where
an uninterrupted run would be: same data order, same random state, same optimizer state.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioner.config import save_config, with_defaults
from captioner.data.dataset import CaptionDataset, EpochSampler, collate, image_transform
from captioner.data.feature_cache import FeatureCache
from captioner.data.readers import read_split
from captioner.data.vocabulary import Vocabulary, training_vocabulary
from captioner.errors import CaptionerError
from captioner.evaluation.caption_metrics import score_captions
from captioner.evaluation.generate import caption_texts, generate_captions
from captioner.models.captioner import build_model
from captioner.training.checkpoint import load_checkpoint, save_checkpoint
from captioner.training.distributed import World, all_sum, barrier, merge_dicts, setup, teardown
from captioner.training.losses import decoder_loss
from captioner.utils import rng_state, seed_everything, set_rng_state

log = logging.getLogger(__name__)


class MetricsLogger:
    """Appends one JSON object per record to ``metrics.jsonl`` and mirrors it to wandb when enabled;
    silent where ``enabled`` is false (ranks other than 0)."""

    def __init__(self, run_dir: Path, config: dict, wandb_mode: str, enabled: bool = True):
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.wandb = None
        if enabled and wandb_mode != "disabled":
            import os

            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self.wandb = wandb.init(project="captioner", dir=str(run_dir), config=config, mode=wandb_mode,
                                    name=run_dir.name, reinit="finish_previous")

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=record.get("step"))

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


class GracefulStop:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps, so a checkpoint can be saved."""

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        if self.requested:  # a second signal: stop at once
            raise KeyboardInterrupt
        self.requested = True
        log.warning("stop requested (%s): saving a resumable checkpoint after this step", signal.Signals(signum).name)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def build_datasets(config: dict, train_records, val_records, vocab: Vocabulary, model):
    """Training pairs and validation images, from cached features or raw images."""
    data = config["data"]
    common = {"max_caption_length": data["max_caption_length"], "max_pixels": data["max_pixels"], "strict": data["strict"]}
    visual = ({"features": FeatureCache(data["features"])} if data["features"]
              else {"transform": image_transform(model.encoder)})
    train_set = CaptionDataset(train_records, vocab, pairs=True, **visual, **common)
    val_set = CaptionDataset(val_records, vocab, pairs=False, **visual, **common)
    for name, dataset in (("train", train_set), ("val", val_set)):
        if dataset.missing:
            log.warning("%s: %d image(s) missing from the feature cache are skipped", name, len(dataset.missing))
    return train_set, val_set


def make_optimizer(model, config: dict) -> torch.optim.Optimizer:
    train = config["train"]
    groups = [{"params": [p for p in model.decoder.parameters() if p.requires_grad], "lr": train["lr"]}]
    encoder_params = [p for p in model.encoder.parameters() if p.requires_grad]
    if encoder_params and not config["data"]["features"]:
        groups.append({"params": encoder_params, "lr": train["encoder_lr"]})
    return torch.optim.Adam(groups, weight_decay=train["weight_decay"])


def make_scheduler(optimizer, config: dict, steps_per_epoch: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Per-step learning-rate factor: a linear warm-up over ``train.warmup_steps``, then ``none`` (constant),
    ``step`` (times ``lr_gamma`` every ``lr_step_epochs``), ``cosine`` (to 0 at the last step) or ``rsqrt``
    (``sqrt(warmup_steps / step)``, the Transformer's inverse-square-root decay)."""
    train = config["train"]
    kind, warmup = train["lr_schedule"], train["warmup_steps"]
    total = max(1, train["epochs"] * steps_per_epoch)
    decays = {
        "none": lambda step: 1.0,
        "step": lambda step: train["lr_gamma"] ** (step // (steps_per_epoch * train["lr_step_epochs"])),
        "cosine": lambda step: 0.5 * (1 + math.cos(math.pi * min(step, total) / total)),
        "rsqrt": lambda step: math.sqrt(max(warmup, 1) / max(step + 1, warmup, 1)),
    }
    if kind not in decays:
        raise CaptionerError(f"train.lr_schedule must be one of {', '.join(decays)}, not {kind!r}")
    decay = decays[kind]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup if warmup else 1.0) * decay(step))


def autocast(device: torch.device, enabled: bool):
    """Mixed precision on CUDA (bf16 where supported, else fp16); a no-op on CPU."""
    if not enabled or device.type != "cuda":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast("cuda", dtype=dtype)


def validate(model, val_set: CaptionDataset, vocab: Vocabulary, config: dict, world: World = World()) -> dict[str, float]:
    """Decode validation images (beam ``train.val_beam``) and score them: BLEU-1..4, ROUGE-L, CIDEr.
    Each rank decodes its share of the images; the captions are gathered so every rank gets the same scores."""
    train = config["train"]
    generations = generate_captions(model, val_set, vocab, beam_size=train["val_beam"],
                                    max_length=config["decode"]["max_length"], batch_size=train["batch_size"],
                                    max_images=train["val_max_images"], shard=(world.rank, world.size))
    texts = merge_dicts(caption_texts(generations, vocab), world)
    references = {r.image_id: r.captions for r in val_set.records if r.image_id in texts}
    return score_captions(references, texts, java=False)


def train_one_epoch(model, loader, optimizer, scheduler, scaler, config: dict, progress: dict, logger: MetricsLogger,
                    stop: GracefulStop, save_last, net=None, world: World = World()) -> bool:
    """One pass over ``loader``. Returns False when the run was asked to stop part-way.

    ``net`` is what runs the forward pass: ``model`` itself, or its DistributedDataParallel wrapper. With
    several ranks each rank's loss is weighted by its share of the global batch's words, so the averaged
    gradient is that of one process over the whole global batch (exactly so for the cross-entropy);
    non-finite losses and stop requests are agreed on by all ranks, so they stop at the same step."""
    train, device = config["train"], model.device
    net = net if net is not None else model
    model.train()
    words_seen, started = 0, time.perf_counter()
    channels_last = train["channels_last"] and device.type == "cuda"
    bar = tqdm(loader, desc=f"epoch {progress['epoch'] + 1}/{train['epochs']}", unit="batch", disable=not world.is_main,
               initial=progress["batch_in_epoch"], total=progress["batch_in_epoch"] + len(loader), leave=False)
    for batch in bar:
        for message in batch["errors"]:
            if message not in progress["skipped_images"]:  # each image once, though it comes with every caption
                progress["skipped_images"].append(message)
                log.warning("skipped unreadable image: %s", message)
                logger.log({"type": "skipped_image", "step": progress["step"], "error": message})
        progress["batch_in_epoch"] += 1  # consumed, even if skipped below: a resumed run starts after it
        if batch["visual"] is None:
            continue
        visual = batch["visual"].to(device, non_blocking=True)
        if channels_last and visual.dim() == 4:
            visual = visual.contiguous(memory_format=torch.channels_last)
        captions = batch["captions"].to(device, non_blocking=True)
        with autocast(device, train["amp"]):
            out = net(visual, captions)
            losses = decoder_loss(model.decoder, out, captions[:, 1:], config)
        loss = losses["loss"]
        optimizer.zero_grad(set_to_none=True)
        local_words = float(losses["words"])
        global_words, nonfinite_ranks, stopping_ranks = all_sum(
            [local_words, float(not torch.isfinite(loss)), float(stop.requested)], world, device)
        if nonfinite_ranks:
            where = f"step {progress['step'] + 1}, epoch {progress['epoch'] + 1}"
            if train["nonfinite"] != "skip":
                raise CaptionerError(f"non-finite loss ({loss.item()}) at {where}; the last good checkpoint is kept "
                                     f"(train.nonfinite=skip skips such batches instead)")
            log.warning("non-finite loss (%s) at %s: batch skipped", loss.item(), where)
            logger.log({"type": "skipped_batch", "step": progress["step"] + 1, "loss": str(loss.item())})
            continue
        if world.distributed:
            loss = loss * (local_words * world.size / max(global_words, 1.0))
        scaler.scale(loss).backward()
        if train["grad_clip"]:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        progress["step"] += 1
        words_seen += int(global_words)
        words_per_s = words_seen / (time.perf_counter() - started)
        bar.set_postfix(loss=f"{losses['loss'].item():.3f}", words_s=f"{words_per_s:.0f}")
        if progress["step"] % train["log_every"] == 0:
            record = {"type": "train", "step": progress["step"], "epoch": progress["epoch"] + 1,
                      "loss": losses["loss"].item(), "cross_entropy": losses["cross_entropy"].item(),
                      "words_per_s": words_per_s, "lr": optimizer.param_groups[0]["lr"]}
            record.update({key: losses[key].item() for key in ("attention", "reinforce", "entropy", "reward", "baseline")
                           if key in losses})
            logger.log(record)
        if train["checkpoint_every"] and progress["step"] % train["checkpoint_every"] == 0:
            save_last()  # a no-op on ranks other than 0
        if stopping_ranks or stop.requested and not world.distributed:
            return False
    progress["words_per_s"] = words_seen / max(time.perf_counter() - started, 1e-9)
    return True


def train(config: dict, *, resume: bool = False, overwrite: bool = False) -> dict:
    """Train a model as ``config`` says; returns ``{"best": score, "checkpoint": path, "train_seconds": s, ...}``.

    Under torchrun every rank calls this: ``train.batch_size`` is the global batch, split evenly over the
    ranks; rank 0 alone writes the run folder."""
    world, device = setup(config["run"]["device"])
    try:
        return _train(config, world, device, resume=resume, overwrite=overwrite)
    finally:
        teardown(world)


def _train(config: dict, world: World, device: torch.device, *, resume: bool, overwrite: bool) -> dict:
    run_dir = Path(config["run"]["out"])
    last_path, best_path = run_dir / "last.pt", run_dir / "best.pt"
    if resume and not last_path.exists():
        raise CaptionerError(f"{last_path}: nothing to resume")
    if not resume and not overwrite and last_path.exists():
        raise CaptionerError(f"{run_dir}: already holds a run; pass --resume to continue it or --overwrite to replace it")
    if config["train"]["nonfinite"] not in ("stop", "skip"):
        raise CaptionerError(f"train.nonfinite must be 'stop' or 'skip', not {config['train']['nonfinite']!r}")
    batch_size = config["train"]["batch_size"]
    if batch_size % world.size:
        raise CaptionerError(f"train.batch_size={batch_size} is the global batch: it must split evenly over "
                             f"{world.size} processes")
    rank_batch = batch_size // world.size
    if world.is_main:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CaptionerError(f"{run_dir}: cannot create the run folder ({err.strerror or err})") from None
        if overwrite and not resume:
            for path in (last_path, best_path, run_dir / "metrics.jsonl"):
                path.unlink(missing_ok=True)
    barrier(world)
    seed_everything(config["run"]["seed"])

    checkpoint = load_checkpoint(last_path) if resume else None
    if checkpoint:
        saved = with_defaults(checkpoint["config"])
        for section in ("model", "encoder"):
            if saved[section] != config[section]:
                changed = sorted(k for k in config[section] if config[section][k] != saved[section].get(k))
                raise CaptionerError(f"{last_path}: cannot resume with a different {section} section "
                                     f"(changed: {', '.join(changed)})")
    train_records, val_records = read_split(config["data"], "train"), read_split(config["data"], "val")
    if checkpoint:
        vocab = Vocabulary.from_dict(checkpoint["vocab"])
    else:
        vocab = training_vocabulary(config["data"], train_records)
    model = build_model(config, len(vocab), pretrained=checkpoint is None)
    train_set, val_set = build_datasets(config, train_records, val_records, vocab, model)
    _check_cache_matches(config)
    model.to(device)
    if config["train"]["channels_last"] and device.type == "cuda":
        model.encoder.to(memory_format=torch.channels_last)
    sampler = EpochSampler(len(train_set), seed=config["run"]["seed"], rank=world.rank, world_size=world.size,
                           lengths=[train_set.caption_length(i) for i in range(len(train_set))],
                           bucket_batch=batch_size if config["data"]["bucket_by_length"] else 0)
    optimizer = make_optimizer(model, config)
    scheduler = make_scheduler(optimizer, config, math.ceil(len(sampler) / rank_batch))
    scaler = torch.amp.GradScaler(device.type, enabled=config["train"]["amp"] and device.type == "cuda"
                                  and not torch.cuda.is_bf16_supported())
    progress = {"epoch": 0, "step": 0, "batch_in_epoch": 0, "best": float("-inf"), "stale": 0, "train_seconds": 0.0,
                "skipped_images": []}
    if checkpoint:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        progress.update(checkpoint["progress"])
        set_rng_state(checkpoint["rng"])
        log.info("resumed %s at epoch %d, step %d", run_dir, progress["epoch"] + 1, progress["step"])
    if world.is_main:
        save_config(config, run_dir / "config.yaml")
    net = model
    if world.distributed:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if config["train"]["compile"]:
        if device.type == "cuda":
            net = torch.compile(net)
        else:
            log.info("train.compile is for CUDA; training uncompiled on %s", device)

    def payload() -> dict:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "progress": dict(progress), "rng": rng_state(), "vocab": vocab.to_dict(), "config": config}

    train_cfg = config["train"]
    logger = MetricsLogger(run_dir, config, train_cfg["wandb"], enabled=world.is_main)
    workers = config["data"]["num_workers"]
    loader = DataLoader(train_set, batch_size=rank_batch, sampler=sampler, collate_fn=collate, num_workers=workers,
                        pin_memory=device.type == "cuda", persistent_workers=workers > 0,
                        generator=torch.Generator())  # keeps the global random state untouched
    started = time.perf_counter()
    seconds_before = progress["train_seconds"]

    def save_last():
        progress["train_seconds"] = seconds_before + time.perf_counter() - started
        if world.is_main:
            save_checkpoint(payload(), last_path)

    stopped = False
    try:
        with GracefulStop() as stop:
            while progress["epoch"] < train_cfg["epochs"]:
                sampler.set_epoch(progress["epoch"], start=progress["batch_in_epoch"] * rank_batch)
                if not train_one_epoch(model, loader, optimizer, scheduler, scaler, config, progress, logger, stop,
                                       save_last, net=net, world=world):
                    save_last()
                    stopped = True
                    log.warning("saved %s; continue with --resume", last_path)
                    break
                scores = validate(model, val_set, vocab, config, world)
                progress["epoch"] += 1
                progress["batch_in_epoch"] = 0
                score = scores[train_cfg["metric"]]
                improved = score > progress["best"]
                if improved:
                    progress["best"], progress["stale"] = score, 0
                else:
                    progress["stale"] += 1
                logger.log({"type": "val", "step": progress["step"], "epoch": progress["epoch"],
                            "words_per_s": progress.get("words_per_s"), **scores})
                if world.is_main:
                    tqdm.write(f"epoch {progress['epoch']}/{train_cfg['epochs']}: "
                               + " ".join(f"{k} {v:.3f}" for k, v in scores.items())
                               + f" | {progress.get('words_per_s', 0):.0f} words/s" + (" (best)" if improved else ""))
                save_last()
                if improved and world.is_main:
                    save_checkpoint(payload(), best_path)
                if train_cfg["early_stopping"] and progress["stale"] >= train_cfg["early_stopping"]:
                    tqdm.write(f"early stop: no {train_cfg['metric']} gain for {progress['stale']} epochs")
                    break
    finally:
        logger.close()
    progress["train_seconds"] = seconds_before + time.perf_counter() - started
    return {"best": progress["best"], "metric": train_cfg["metric"], "epochs": progress["epoch"],
            "step": progress["step"], "train_seconds": progress["train_seconds"], "stopped": stopped,
            "checkpoint": str(best_path if best_path.exists() else last_path), "run_dir": str(run_dir),
            "words_per_s": progress.get("words_per_s"), "skipped_images": len(progress["skipped_images"])}


def _check_cache_matches(config: dict) -> None:
    """Training from a cache made by another encoder would silently learn from the wrong features."""
    if not config["data"]["features"]:
        return
    cached = FeatureCache(config["data"]["features"]).meta.get("encoder") or {}
    mismatched = [k for k in ("name", "image_size", "stride", "grid") if k in cached and cached[k] != config["encoder"][k]]
    if mismatched:
        raise CaptionerError(f"{config['data']['features']}: cached with another encoder "
                             f"({', '.join(f'{k}={cached[k]!r}' for k in mismatched)}); match the encoder section or re-cache")
