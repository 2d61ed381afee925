"""Shared fixtures: a tiny COCO-format caption dataset of real image files, and tiny configs.

`make test` runs the suite on parallel workers (pytest-xdist, ``-n auto --dist loadscope --no-loadscope-reorder``):
:func:`pytest_xdist_auto_num_workers` picks how many; each worker gets an equal share of the cores as torch threads;
each test module runs whole on one worker, in its own order, so that its module-scoped fixtures (a trained run,
METEOR's Java, a live server, a 60-megapixel PNG) are made once; the heaviest modules start first
(:func:`pytest_collection_modifyitems`); and the costly session fixtures are built once for all workers
(:func:`shared_by_workers`). Plain ``pytest tests`` still runs everything in one process, in collection order.
(``--dist loadgroup`` with xdist_group marks would be finer, but pytest 9.2 ignores the node-ID suffix through
which pytest-xdist 3.8 groups tests, so those marks have no effect there.)"""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioner.core.devices import usable_cores

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")

MAX_WORKERS = 6     # past this the longest test (the demo's) bounds the run, and each worker repeats its set-up


@pytest.hookimpl(optionalhook=True)        # a hook of pytest-xdist's: unknown to pytest without it
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per usable core, at most :data:`MAX_WORKERS` (PYTEST_XDIST_AUTO_NUM_WORKERS
    overrides, as in xdist itself)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    return min(usable_cores(), MAX_WORKERS)


WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if WORKERS > 1:
    # A worker's fair share of the cores: torch's default (every core in each worker) makes the workers' threads
    # wait on one another. Child processes (servers, notebook kernels) inherit the share through OMP_NUM_THREADS;
    # tests that compare a child's floats with this process's pass torch.get_num_threads() on explicitly.
    THREADS = max(1, usable_cores() // WORKERS)
    torch.set_num_threads(THREADS)
    os.environ["OMP_NUM_THREADS"] = str(THREADS)

# Tests that take tens of seconds (besides those marked slow), marked slow, so that `-m "not slow"` gives a quick run.
LONG_TESTS = {
    "test_demo_fast_writes_the_summary_figures_and_report", "test_notebook_runs_in_small_mode",
    "test_cpu_switches_channels_last_a_no_op_amp_and_compile_close_to_float32",
    "test_hard_attention_run_round_trips_and_compare_writes_report",
    "test_the_decoding_process_gives_the_captions_of_the_server_process",
    "test_resume_after_epoch_equals_uninterrupted", "test_every_script_make_target_and_benchmark_shown_exists",
    "test_transformer_run_trains_captions_and_joins_the_comparison", "test_an_easy_reward_is_driven_to_its_maximum",
    "test_wandb_project_entity_tags_and_a_resumed_run_continues_its_wandb_run",
    "test_train_from_cached_features_then_cli_caption_and_evaluate",
    "test_a_burst_of_64_uploads_of_a_60_megapixel_png_stays_under_the_memory_ceiling",
    "test_two_gloo_processes_train_like_one_process_with_the_same_global_batch",
    "test_signal_mid_epoch_saves_and_resume_equals_uninterrupted",
    "test_kill_9_mid_epoch_then_resume_equals_uninterrupted",
    "test_an_export_captions_as_its_checkpoint_in_torch_and_in_onnx_runtime",
}


# On parallel workers the modules start heaviest first, so that the workers end together (longest processing time
# first): these, by their share of a `make test` on 2 cores (pytest --durations=0, 2026-11-26; test_results, which
# computes every probe of the committed results, 2026-11-30), then the others.
HEAVY_MODULES = ("test_results", "test_demo", "test_wheel", "test_export", "test_notebooks", "test_distributed",
                 "test_serve_hostile", "test_caption_metrics", "test_reliability", "test_speed_levers", "test_training",
                 "test_serve", "test_serve_batching")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if getattr(item, "originalname", item.name) in LONG_TESTS:
            item.add_marker(pytest.mark.slow)
    if "PYTEST_XDIST_WORKER" in os.environ:      # each worker collects alike, so they agree on the order
        rank = {name: index for index, name in enumerate(HEAVY_MODULES)}
        items.sort(key=lambda item: rank.get(item.module.__name__.rpartition(".")[2], len(rank)))   # stable


def shared_by_workers(tmp_path_factory, name: str, build):
    """``build(folder)``'s result (JSON), with ``folder`` a new temporary folder: built once per run, by whichever
    worker first asks, and read back by the others (each xdist worker has a session of its own)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    from filelock import FileLock  # a dependency of torch's

    root = tmp_path_factory.getbasetemp().parent        # the run's folder, above each worker's own
    folder, result = root / name, root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if not result.exists():
            shutil.rmtree(folder, ignore_errors=True)       # what a worker whose build failed left
            folder.mkdir()
            result.write_text(json.dumps(build(folder)))
    return json.loads(result.read_text())


COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 60, 220)}


def _write_split(root, split, count, first_id, rng):
    images, annotations = [], []
    for k in range(count):
        image_id = first_id + k
        colour = list(COLOURS)[k % 3]
        pixels = rng.integers(0, 60, size=(32, 32, 3), dtype=np.uint8)
        x = 0 if (k // 3) % 2 == 0 else 16
        pixels[8:24, x : x + 16] = COLOURS[colour]
        side = "left" if x == 0 else "right"
        name = f"{split}/{image_id}.png"
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / "images" / name)
        images.append({"id": image_id, "file_name": name, "width": 32, "height": 32})
        for j, caption in enumerate([f"a {colour} square on the {side}", f"the {colour} square is {side}"]):
            annotations.append({"id": image_id * 10 + j, "image_id": image_id, "caption": caption})
    (root / "annotations").mkdir(exist_ok=True)
    (root / "annotations" / f"captions_{split}.json").write_text(json.dumps({"images": images, "annotations": annotations}))


@pytest.fixture(scope="session")
def tiny_coco(tmp_path_factory):
    """12 train / 6 val / 6 test 32x32 images of a coloured square on one side, two captions each."""
    def build(root):
        rng = np.random.default_rng(0)
        for split, count, first in (("train", 12, 100), ("val", 6, 200), ("test", 6, 300)):
            _write_split(root, split, count, first, rng)
        return str(root)

    return Path(shared_by_workers(tmp_path_factory, "tiny_coco", build))


def tiny_config(root, out, **sections):
    """A complete config for a seconds-long run on ``tiny_coco`` (random-init encoder, no downloads)."""
    from captioner.config import load_config

    splits = ("train", "val", "test")
    overrides = [
        f"data.captions={json.dumps({s: str(root / 'annotations' / f'captions_{s}.json') for s in splits})}",
        f"data.images={json.dumps({s: str(root / 'images') for s in splits})}",
        "data.vocab_min_count=1", f"run.out={out}", "run.device=cpu",
        "encoder.name=mobilenet_v2", "encoder.pretrained=false", "encoder.image_size=32", "encoder.stride=16",
        "model.lstm.attention_dim=8", "model.lstm.embed_dim=8", "model.lstm.hidden_dim=16", "model.lstm.dropout=0.2",
        "train.epochs=2", "train.batch_size=5", "train.log_every=1", "train.wandb=disabled", "train.early_stopping=0",
        "decode.max_length=8", "train.amp=false",   # train.amp=auto may measure: tests/test_precision.py
    ]
    for section, values in sections.items():
        overrides += [f"{section}.{k}={json.dumps(v)}" for k, v in values.items()]
    return load_config(None, overrides)


def padded_logits(out, mask: torch.Tensor) -> torch.Tensor:
    """The ``logits`` of a decoder's :class:`~captioner.models.decoder.TeacherForced` output ``out`` (real positions
    only) as (B, T, V), zero at the positions ``mask`` (B, T) marks as padding."""
    padded = out.logits.new_zeros(*mask.shape, out.logits.shape[-1])
    padded[mask] = out.logits
    return padded


def memorise(decoder, features, captions, lr: float, steps: int = 150) -> float:
    """Fit ``decoder`` to ``captions`` (B, T+1) of ``features`` (B, L, D) with Adam; returns the last loss."""
    from captioner.objectives.losses import caption_loss

    optimizer = torch.optim.Adam(decoder.parameters(), lr=lr)
    for _ in range(steps):
        out = decoder(features, captions)
        loss = caption_loss(out.logits, captions[:, 1:], out.alpha, 0.0)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def caption_and_attend(checkpoint, image: Path, figure: Path | None, capsys) -> None:
    """``captioner caption --json`` of ``image`` by ``checkpoint`` succeeds and names the image; with ``figure``,
    ``captioner attend`` draws it there too."""
    from captioner.cli import main

    capsys.readouterr()
    assert main(["caption", str(image), "--checkpoint", str(checkpoint), "--json", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["image"] == str(image)
    if figure is not None:
        assert main(["attend", str(image), "--checkpoint", str(checkpoint), "--out", str(figure),
                     "--device", "cpu"]) == 0


def count_meteor_starts(patch: pytest.MonkeyPatch) -> list[str]:
    """Through ``patch``, make every METEOR Java process started from now on append its ``java`` to the returned
    list; closes the one an earlier test on this worker may have left kept."""
    from captioner.evaluation import caption_metrics

    started: list[str] = []

    class CountedMeteor(caption_metrics._MeteorProcess):
        def __init__(self, java):
            started.append(java)
            super().__init__(java)

    patch.setattr(caption_metrics, "_MeteorProcess", CountedMeteor)
    caption_metrics._KEPT_METEOR.close()
    return started


@pytest.fixture(scope="session")
def served_checkpoints(tiny_coco, tmp_path_factory):
    """Checkpoints for the server tests, by run name: ``soft`` (2x2 grid), ``hard`` (hard attention), both
    with region positions (regions then differ even where the untrained encoder's features hardly do),
    ``wide`` (32x64 images: a 2x4 grid) and ``transformer``, each trained for a few seconds on ``tiny_coco``."""
    from captioner.training.engine import train

    positions = {"region_position": "sinusoidal", "position_dim": 8}
    runs = {"soft": {"model": {"lstm": positions}}, "hard": {"model": {"lstm": {**positions, "attention_mode": "hard"}}},
            "wide": {"encoder": {"image_size": [32, 64]}},
            "transformer": {"model": {"decoder": "transformer", "transformer": {"d_model": 16, "num_layers": 1,
                                                                              "num_heads": 2, "ffn_dim": 32}},
                            "loss": {"doubly_stochastic": 0.0}}}
    return shared_by_workers(tmp_path_factory, "served", lambda root: {
        name: train(tiny_config(tiny_coco, root / name, train={"epochs": 1}, **sections))["checkpoint"]
        for name, sections in runs.items()})


@pytest.fixture(scope="session")
def shapes_checkpoint(tmp_path_factory):
    """A checkpoint trained for a few seconds on a tiny shapes dataset (12 images of 32x32 px, made as `captioner data
    shapes` makes them), in its run folder beside the data: ``data/images/{train,val,test}/*.png``."""
    from captioner.data.shapes import generate_shapes
    from captioner.training.engine import train

    def build(root):
        generate_shapes(root / "data", seed=1, num_images=12, image_size=32)
        return train(tiny_config(root / "data", root / "run", train={"epochs": 1}), progress=False)["checkpoint"]

    return Path(shared_by_workers(tmp_path_factory, "shapes_run", build))
