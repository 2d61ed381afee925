"""Fingerprints of the code's behaviour: what the measured code computes on small fixed probes.

A result (:mod:`captioner.results.record`) names the probes its numbers depend on and keeps what each computed
when the numbers were taken. A probe is named ``KIND [CONFIG]``, the config as :class:`ConfigRef` reads it
(``RECIPE [--init-from RECIPE] [OVERRIDE ...]``, ``RECIPE`` a packaged recipe or ``defaults``). The kinds:
``train`` (a few steps of each objective the recipe trains on, on a fixed batch: loss terms, gradient norms),
``decode`` and ``ensemble`` (the recipe's model fitted to the probe captions, decoding), ``data`` (the data path
on three drawn images), and ``text``, ``metrics``, ``shapes``.

Probes run on the CPU in float64 (``data``, which trains nothing: float32) on one thread, seeded. A probe that
fits or trains a model for some Adam steps amplifies rounding: in float32 the kernels of two CPUs (AVX2 and AVX-512)
end in other numbers, in float64 they agree far inside :data:`RELATIVE_TOLERANCE`. Numbers are compared within
it; words, token sequences and hashes exactly, except that a decoded caption may differ where its score ties the
recorded one within the tolerance.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import math
import shlex
from collections.abc import Iterator

RELATIVE_TOLERANCE = 1e-4
"""Two probe numbers agree when they differ by at most this fraction of the larger (or by 1e-6 near zero)."""
ABSOLUTE_TOLERANCE = 1e-6
DIGITS = 7
"""Significant digits a probe's numbers are kept with."""

PROBE_CAPTIONS = (
    "a man in a red shirt is riding a bike down the street .",
    "two dogs are running through the grass",
    "a woman sits on a bench near the water",
    "the black dog is jumping over a red ball",
    "a child in a blue shirt plays with a dog on the grass",
    "people are walking down a street in the city",
    "a man and a woman are sitting on a bench",
    "a dog runs on the beach near the water",
)
"""The captions of the probes' batch and vocabulary (every word at least twice, ``.`` tokenised away)."""
TRAIN_STEPS = 2
"""Training steps of a ``train`` probe on its objective (after the warm-start step, if any)."""
TRAIN_CAPTIONS = 4
"""Captions (one image each) in a ``train`` probe's batch: the first of :data:`PROBE_CAPTIONS`."""
PROBE_IMAGES = 3
"""Images a ``decode`` probe captions."""
FIT_STEPS, FIT_LR = 12, 4e-3
"""Adam steps and learning rate that fit a ``decode`` probe's model to the probe captions first."""


def rounded(value: float) -> float:
    """``value`` to :data:`DIGITS` significant digits (NaN and infinities as they are)."""
    if not math.isfinite(value) or value == 0:
        return value
    return float(f"{value:.{DIGITS - 1}e}")


@dataclasses.dataclass(frozen=True)
class ConfigRef:
    """A recipe (or ``defaults``) with overrides, and the recipe whose trained model it starts from, if any (its
    model and encoder sections, as ``train.init_from`` takes them from a checkpoint): what a result was made with.
    Written ``RECIPE [--init-from RECIPE] [OVERRIDE ...]``."""

    recipe: str
    overrides: tuple[str, ...] = ()
    init_from: str | None = None

    @property
    def key(self) -> str:
        start = ["--init-from", self.init_from] if self.init_from else []
        return shlex.join([self.recipe, *start, *self.overrides])

    @classmethod
    def parse(cls, key: str) -> "ConfigRef":
        recipe, *rest = shlex.split(key)
        init_from = None
        if rest[:1] == ["--init-from"]:
            init_from, rest = rest[1], rest[2:]
        return cls(recipe, tuple(rest), init_from)

    def load(self):
        from captioner.config import load_config, recipes

        for name in (self.recipe, self.init_from):
            if name not in (None, "defaults") and name not in recipes():
                raise KeyError(f"no recipe {name!r}")
        config = load_config(None if self.recipe == "defaults" else recipes()[self.recipe], self.overrides)
        if self.init_from:
            start = ConfigRef(self.init_from).load()
            config = dataclasses.replace(config, model=start.model, encoder=start.encoder)
        if self.init_from or config.train.init_from:          # as a run that starts from trained weights builds it
            from captioner.training.engine import fine_tuning_model
            config = fine_tuning_model(config)
        return config


def probe_name(kind: str, *configs: ConfigRef) -> str:
    """The name of a probe: ``probe_name("train", ConfigRef("flickr8k_full_soft"))`` -> ``train flickr8k_full_soft``."""
    if kind == "ensemble":
        return shlex.join([kind, *(c.recipe for c in configs)])
    return " ".join([kind, *(c.key for c in configs)])


@contextlib.contextmanager
def probe_conditions(seed: int = 0, dtype: str = "float64") -> Iterator[None]:
    """One torch thread, ``dtype`` as the default dtype and the global random state seeded, all restored after."""
    import torch

    from captioner.core.randomness import rng_state, seed_everything, set_rng_state

    threads, default, saved = torch.get_num_threads(), torch.get_default_dtype(), rng_state()
    try:
        torch.set_num_threads(1)
        torch.set_default_dtype(getattr(torch, dtype))
        seed_everything(seed)
        yield
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(default)
        set_rng_state(saved)


def probe_vocabulary():
    from captioner.data.vocabulary import Vocabulary

    return Vocabulary.build(PROBE_CAPTIONS, min_count=1)


def probe_batch(config, vocab, model, size: int = len(PROBE_CAPTIONS)) -> dict:
    """The probes' training batch as the data pipeline collates it: the first ``size`` probe captions, each with
    fixed random features of the encoder's size (or, for a recipe that trains from images, a fixed random image)."""
    import torch

    from captioner.data.dataset import collate

    generator = torch.Generator().manual_seed(1)
    encoder = model.encoder
    items = []
    for i, caption in enumerate(PROBE_CAPTIONS[:size]):
        if config.data.features:
            kind, visual = "features", torch.rand(encoder.grid[0] * encoder.grid[1], encoder.feature_dim,
                                                  generator=generator)
        else:
            size = config.encoder.image_size
            height, width = (size, size) if isinstance(size, int) else size
            kind, visual = "images", torch.rand(3, height, width, generator=generator)
        tokens = torch.tensor(vocab.encode(caption, config.data.max_caption_length), dtype=torch.long)
        items.append({"index": i, "image_id": i, "kind": kind, "visual": visual, "caption": tokens, "error": None})
    return collate(items)


def probe_model(config, vocab):
    """A new model of ``config`` as training builds it (seeded), without the encoder's pretrained weights when the
    run reads cached features (it never runs the encoder then)."""
    from captioner.checkpoint import build_model

    return build_model(config, len(vocab), pretrained=False if config.data.features else None)


def numbers(losses: dict) -> dict:
    return {key: rounded(float(value.detach())) for key, value in sorted(losses.items()) if value.dim() == 0}


def gradient_norms(model) -> list[float]:
    """The norm of each weight's gradient, largest first (independent of the weights' names and order)."""
    return sorted((rounded(float(p.grad.double().norm())) for p in model.parameters() if p.grad is not None),
                  reverse=True)


def train_probe(config) -> dict:
    """A few training steps of ``config``'s model through the engine's own step (see the module docstring)."""
    import torch

    from captioner.objectives.losses import build_loss
    from captioner.objectives.scst import metric_reward
    from captioner.training import engine
    from captioner.training.averaging import WeightAverage
    from captioner.training.distributed import World

    config = dataclasses.replace(config, train=dataclasses.replace(config.train, amp=False, compile=False))
    vocab = probe_vocabulary()
    model = probe_model(config, vocab)
    batch = probe_batch(config, vocab, model, TRAIN_CAPTIONS)
    start = engine.prepare_fine_tuning(model, config)      # as a run does: the frozen start, the frozen parameters
    optimizer = engine.make_optimizer(model, config)
    train = config.train
    loss = build_loss(model.decoder, config.loss)
    self_critical = None
    if train.objective == "scst":
        references = {i: [caption] for i, caption in enumerate(PROBE_CAPTIONS)}
        reward = metric_reward(references, None, count_end=train.scst_count_end, bleu_weight=train.scst_bleu_weight)
        self_critical = engine.self_critical_objective(config, vocab, reward, loss)
    run = engine.Run(config=config, world=World(), device=torch.device("cpu"), dir=None, vocab=vocab, model=model,
                     net=model, loss=loss, optimizer=optimizer,
                     scheduler=engine.make_scheduler(optimizer, config, TRAIN_STEPS), scaler=torch.amp.GradScaler(
                         "cpu", enabled=False), loaders={}, val_set=None, self_critical=self_critical, start=start,
                     average=WeightAverage(model, train.ema_decay) if train.ema_decay else None, logger=None,
                     rank_batch=TRAIN_CAPTIONS)
    state, stop = engine.TrainState(), type("NoStop", (), {"requested": False})()
    steps = []          # the objectives the run trains on, in its order: cross-entropy (warm start first), SCST
    if train.objective == "xe" or train.scst_after_epoch:
        steps += [("xe", True)] * bool(train.expectation_epochs) + [("xe", False)] * TRAIN_STEPS
    steps += [("scst", False)] * TRAIN_STEPS if self_critical else []
    model.train()
    run.loss.train()
    out = []
    for objective, warm in steps:
        with engine.expectation_only(model.decoder, warm):
            losses = engine.decoder_loss(run, batch, objective)
        engine.optimizer_step(run, state, losses, stop)
        out.append({"objective": objective + (" (expectation only)" if warm else ""), "losses": numbers(losses),
                    "gradient_norms": gradient_norms(model)})
    if run.average is None:
        return {"steps": out}
    with run.averaged():    # what validates and decodes
        averaged = sorted((rounded(float(p.detach().double().norm())) for p in run.average.params), reverse=True)
    return {"steps": out, "averaged_weight_norms": averaged}


def generations(generated) -> list[dict]:
    from captioner.models.attention import attention_entropy

    out = []
    for g in generated:
        alpha = g.attention.get("alpha")
        entropy = None if alpha is None or len(alpha) == 0 else float(attention_entropy(alpha.double()).mean())
        out.append({"tokens": list(g.tokens), "log_prob": rounded(float(g.log_prob)),
                    "attention_entropy": None if entropy is None else rounded(entropy)})
    return out


def fitted_model(config, vocab):
    """A new model of ``config`` (seeded) after :data:`FIT_STEPS` Adam steps of torch's own cross-entropy (not the
    recipe's loss, which the ``train`` probe covers) on the first :data:`PROBE_IMAGES` probe captions, so that it
    writes captions of the probe words from their features (a new model writes none: its first word is as likely
    ``<end>`` as any); in evaluation mode, with those features."""
    import torch
    import torch.nn.functional as F

    from captioner.core.randomness import rng_state, set_rng_state
    from captioner.data.tokens import PAD_INDEX

    key = fit_key(config, vocab)
    model = probe_model(config, vocab)
    batch = probe_batch(config, vocab, model, PROBE_IMAGES)
    if key in _FITS:                                    # the same fit from the same random state: its end
        _FITS.move_to_end(key)
        changed, state = _FITS[key]
        model.load_state_dict(changed, strict=False)
        set_rng_state(state)
        return model.eval(), batch["features"]
    optimizer = torch.optim.Adam(model.decoder.parameters(), lr=FIT_LR)
    model.train()
    for _ in range(FIT_STEPS):
        optimizer.zero_grad()
        out = model(batch["captions"], features=batch["features"])
        targets = batch["captions"][:, 1:]
        targets = targets if out.repeats is None else targets.repeat_interleave(out.repeats, 0)
        F.cross_entropy(out.logits.double(), targets[targets != PAD_INDEX]).backward()
        optimizer.step()
    # what fitting changed: the decoder's weights and every buffer (an encoder run on images updates its norms)
    buffers = {name for name, _ in model.named_buffers()}
    changed = {name: value.detach().clone() for name, value in model.state_dict().items()
               if name.startswith("decoder.") or name in buffers}
    _FITS[key] = changed, rng_state()
    while len(_FITS) > FITS_KEPT:
        _FITS.popitem(last=False)
    return model.eval(), batch["features"]


FITS_KEPT = 8
"""Fits :func:`fitted_model` keeps (the least recently used go first), so that the decode probes of one model that
differ in their training or decoding settings, and an ensemble's first member, fit it once. Within a process the
code does not change; a test that changes its behaviour clears these with the cached probe values."""
_FITS: collections.OrderedDict = collections.OrderedDict()


def fit_key(config, vocab) -> str:
    """What :func:`fitted_model`'s result depends on: the model and encoder sections, the batch's data settings,
    the vocabulary, the default dtype and the random state it starts from."""
    import torch

    from captioner.core.randomness import rng_state

    state = rng_state()
    random_state = hashlib.sha256(state["torch"].numpy().tobytes() + repr(state["python"]).encode()).hexdigest()
    return repr((config.model, config.encoder, bool(config.data.features), config.data.max_caption_length,
                 tuple(vocab.words), str(torch.get_default_dtype()), random_state))


def decode_probe(config) -> dict:
    """:func:`fitted_model` decoding the features of the first :data:`PROBE_IMAGES` probe captions by the
    ``decode`` section of ``config``."""
    from captioner.decoding.search import DecodeConfig, decode

    vocab = probe_vocabulary()
    model, features = fitted_model(config, vocab)
    return {"captions": generations(decode(model.decoder, model.regions(features=features), vocab,
                                           DecodeConfig.of(config), images=list(range(PROBE_IMAGES))))}


def ensemble_probe(configs: list) -> dict:
    """:func:`fitted_model` of each of ``configs`` (one after the other) decoding together, by the first one's
    ``decode`` section."""
    from captioner.decoding.ensemble import EnsembleDecoder
    from captioner.decoding.search import DecodeConfig, decode

    vocab = probe_vocabulary()
    fitted = [fitted_model(config, vocab) for config in configs]
    decoder = EnsembleDecoder([model.decoder for model, _ in fitted])
    regions = fitted[0][0].regions(features=fitted[0][1])
    return {"captions": generations(decode(decoder, regions, vocab, DecodeConfig.of(configs[0]),
                                           images=list(range(PROBE_IMAGES))))}


def probe_image(variant: int = 0):
    """A fixed drawn RGB image (160 x 120): a gradient with a disc and a bar, placed by ``variant``."""
    import numpy as np
    from PIL import Image, ImageDraw

    y, x = np.mgrid[0:120, 0:160]
    pixels = np.stack([x * 255 // 159, y * 255 // 119, (x + y) * 255 // 278], axis=-1).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(image)
    shift = 30 * variant
    draw.ellipse((20 + shift, 30, 70 + shift, 80), fill=(200, 30, 40))
    draw.rectangle((90 - shift, 20 + shift, 140 - shift, 40 + shift), fill=(20, 160, 60))
    return image


def write_probe_data(folder, config):
    """Three JPEG images with two probe captions each in ``folder``, in the layout of ``config``'s
    ``data.format``; returns ``config`` reading them (split ``train``) and caching features in ``folder``."""
    import json

    images = folder / "images"
    images.mkdir()
    entries = []
    for i in range(3):
        probe_image(i).save(images / f"{i}.jpg", quality=90)
        entries.append((i, f"{i}.jpg", [PROBE_CAPTIONS[2 * i], PROBE_CAPTIONS[2 * i + 1]]))
    data = {"features": str(folder / "features")}
    if config.data.format == "coco":
        annotations = [{"id": 10 * i + k, "image_id": i, "caption": c} for i, _, captions in entries
                       for k, c in enumerate(captions)]
        (folder / "captions.json").write_text(json.dumps({"images": [
            {"id": i, "file_name": name, "width": 160, "height": 120} for i, name, _ in entries],
            "annotations": annotations}))
        data |= {"captions": {"train": str(folder / "captions.json")}, "images": {"train": str(images)}}
    else:
        (folder / "dataset.json").write_text(json.dumps({"images": [
            {"imgid": i, "filename": name, "filepath": "images", "split": "train",
             "sentences": [{"raw": c, "tokens": c.split()} for c in captions]} for i, name, captions in entries]}))
        data |= {"karpathy": str(folder / "dataset.json"), "image_root": str(folder)}
    return dataclasses.replace(config, data=dataclasses.replace(config.data, **data))


def data_probe(config) -> dict:
    """The data path of ``config`` on three drawn JPEG images in its data format: records read, features cached
    by its encoder (weights as configured), the training vocabulary, and the training batch collated from the
    cache: what reaches the model."""
    import tempfile
    from pathlib import Path

    from captioner.data.dataset import collate, make_dataset
    from captioner.data.readers import read_split
    from captioner.data.vocabulary import training_vocabulary
    from captioner.training.features import cache_features

    with tempfile.TemporaryDirectory() as folder:
        config = write_probe_data(Path(folder), config)
        cache_features(config, ["train"], progress=False)
        records = read_split(config.data, "train")
        vocab = training_vocabulary(config.data, records)
        dataset = make_dataset(config.data, records, vocab, None, pairs=True)
        batch = collate([dataset[i] for i in range(len(dataset))])
    features = batch["features"].double()                                    # (items, L, D)
    return {"records": [[r.image_id, list(r.captions)] for r in records], "vocabulary": vocab.words,
            "captions": batch["captions"].tolist(), "features_shape": list(features.shape),
            # the mean of |x|, not of x: normalised features sum to near zero, where CPUs differ in the first digits
            "features_mean_abs": rounded(float(features.abs().mean())), "features_std": rounded(float(features.std())),
            "features_norms": [rounded(float(v)) for v in features.flatten(1).norm(dim=1)],
            "features_max": rounded(float(features.max()))}


def text_probe() -> dict:
    """The tokeniser on awkward captions, and the probes' vocabulary with what it encodes and decodes."""
    from captioner.data.text import tokenize

    awkward = ["A man's dog (a Lab) runs... fast!", "Two kids -- ages 5 & 7 -- play at St. Mary's, don't they?",
               "\u201cSlip n' slide\u201d on the U.S. lawn; 1/2 price @home"]
    vocab = probe_vocabulary()
    encoded = vocab.encode("a dog in a purple hat runs", 6)
    return {"tokens": [tokenize(text) for text in awkward], "vocabulary": vocab.words, "encoded": encoded,
            "decoded": vocab.decode(encoded)}


def metrics_probe() -> dict:
    """The caption metrics (without Java), diversity, attention statistics, grounding and the shapes measures on
    fixed captions, maps and boxes."""
    import numpy as np
    import torch

    from captioner.decoding.search import Generation
    from captioner.evaluation.attention_stats import attention_statistics
    from captioner.evaluation.caption_metrics import score_captions
    from captioner.evaluation.diversity import diversity_measures
    from captioner.evaluation.grounding import Target, ground_map
    from captioner.evaluation.shapes_metrics import shapes_scores

    references = {i: [PROBE_CAPTIONS[i], PROBE_CAPTIONS[(i + 3) % 8]] for i in range(4)}
    candidates = {0: "a man riding a bike down the street", 1: "two dogs running in the grass",
                  2: "a woman sitting on a bench", 3: "a dog is jumping over a ball ball"}
    scores = score_captions(references, candidates, java=False)
    generator = torch.Generator().manual_seed(3)
    maps = {i: Generation([4, 5, 6], 0.0, {"alpha": torch.softmax(torch.randn(3, 16, generator=generator) * 2, -1)})
            for i in range(2)}
    statistics = attention_statistics(maps)
    statistics.pop("coverage")
    attention = maps[0].attention["alpha"][0].view(4, 4).numpy()
    grounding = [ground_map(attention, Target("dog", box), (64, 64)) for box in ([0, 0, 32, 32], [16, 40, 40, 20])]
    objects = {1: [{"shape": "circle", "colour": "red", "size": "large", "bbox": [10, 10, 30, 30]},
                   {"shape": "square", "colour": "blue", "size": "small", "bbox": [80, 70, 20, 20]}]}
    shapes = shapes_scores({1: "there is a large red circle to the left of a small blue square"}, objects)
    return {"scores": {k: rounded(float(v)) for k, v in sorted(scores.items()) if isinstance(v, (int, float))},
            "diversity": {k: rounded(float(v)) for k, v in sorted(diversity_measures(candidates).items())},
            "attention": {k: rounded(float(v)) for k, v in sorted(statistics.items())},
            "grounding": [[rounded(hit), rounded(inside)] for hit, inside in grounding],
            "shapes": {k: None if v is None else rounded(float(v)) for k, v in sorted(shapes.items())
                       if v is None or isinstance(v, (int, float))},
            "grounding_map_sum": rounded(float(np.asarray(attention).sum()))}


def shapes_probe() -> dict:
    """The shapes generator's first scenes (objects and captions) and the SHA-256 of their pixels."""
    from captioner.data.shapes import render_image, sample_scene

    scenes = []
    for image_id in range(1, 5):
        objects, captions = sample_scene(0, image_id, 128)
        pixels = render_image(0, image_id, objects, 128).tobytes()
        scenes.append({"objects": [dataclasses.asdict(o) for o in objects], "captions": captions,
                       "pixels_sha256": hashlib.sha256(pixels).hexdigest()})
    return {"scenes": scenes}


def compute(name: str) -> dict:
    """What probe ``name`` computes now (see the module docstring); KeyError for a name no probe answers to."""
    return _compute(name)


@functools.cache
def _compute(name: str) -> dict:
    kind, *rest = shlex.split(name)
    plain = {"text": text_probe, "metrics": metrics_probe, "shapes": shapes_probe}
    with probe_conditions(dtype="float32" if kind == "data" else "float64"):
        if kind in plain and not rest:
            return plain[kind]()
        if kind == "ensemble" and rest:
            return ensemble_probe([ConfigRef(recipe).load() for recipe in rest])
        configured = {"train": train_probe, "decode": decode_probe, "data": data_probe}
        if kind in configured and rest:
            return configured[kind](ConfigRef.parse(shlex.join(rest)).load())
    raise KeyError(f"no probe {name!r}")


def differences(recorded, current, where: str = "") -> list[str]:
    """Where ``current`` differs from ``recorded`` beyond the tolerance, each as ``PATH: RECORDED -> CURRENT``."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        if "tokens" in recorded and "log_prob" in recorded and recorded["tokens"] != current.get("tokens"):
            if not close(recorded["log_prob"], current.get("log_prob")):     # another caption, not a tie
                return [f"{where}tokens: {recorded['tokens']} -> {current.get('tokens')}"]
            recorded, current = dict(recorded, tokens=None), dict(current, tokens=None)
        out = []
        for key in sorted(set(recorded) | set(current), key=str):
            if key not in recorded or key not in current:
                out.append(f"{where}{key}: {'missing' if key not in recorded else recorded[key]} -> "
                           f"{'missing' if key not in current else current[key]}")
            else:
                out += differences(recorded[key], current[key], f"{where}{key}.")
        return out
    if isinstance(recorded, list) and isinstance(current, list):
        if len(recorded) != len(current):
            return [f"{where.rstrip('.')}: {len(recorded)} items -> {len(current)}"]
        return [d for i, (a, b) in enumerate(zip(recorded, current)) for d in differences(a, b, f"{where}{i}.")]
    if isinstance(recorded, float) or isinstance(current, float):
        return [] if close(recorded, current) else [f"{where.rstrip('.')}: {recorded} -> {current}"]
    return [] if recorded == current else [f"{where.rstrip('.')}: {recorded!r} -> {current!r}"]


def close(a, b) -> bool:
    """Whether two probe numbers agree within the tolerance (NaN agrees with NaN)."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= max(ABSOLUTE_TOLERANCE, RELATIVE_TOLERANCE * max(abs(a), abs(b)))
