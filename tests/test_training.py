"""Training engine end to end on a tiny dataset: runs, resume equals an uninterrupted run, fine-tuning
gradients, the feature cache, and the CLI around them."""

import dataclasses
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from captioner.checkpoint import build_model, load_checkpoint
from captioner.cli import main
from captioner.config import load_config, save_config
from captioner.core.console import progress_bar
from captioner.data.feature_cache import FeatureCache, build_feature_cache
from captioner.data.images import image_transform, load_image
from captioner.data.readers import read_split
from captioner.errors import CaptionerError
from captioner.objectives.losses import caption_loss
from captioner.training import engine
from captioner.training.engine import train
from captioner.visualisation import attention_figure
from tests.conftest import caption_and_attend, tiny_config


def state_of(path):
    return load_checkpoint(path)["model"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)


def test_train_writes_run_directory(tiny_coco, tmp_path):
    result = train(tiny_config(tiny_coco, tmp_path / "run"))
    run = tmp_path / "run"
    assert {"config.yaml", "last.pt", "best.pt", "metrics.jsonl"} <= {p.name for p in run.iterdir()}
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["type"] for r in records} == {"train", "val"}
    val = [r for r in records if r["type"] == "val"]
    assert len(val) == 2
    assert all(r["epoch_seconds"] > 0 and r["val_seconds"] > 0 for r in val)      # each epoch's time, apart
    assert sum(r["epoch_seconds"] + r["val_seconds"] for r in val) <= result["train_seconds"]
    assert result["epochs"] == 2 and result["step"] == 2 * 5  # 24 pairs / batch 5 = 5 steps per epoch
    payload = load_checkpoint(run / "last.pt")
    assert {"model", "optimizer", "scheduler", "progress", "rng", "vocab", "config"} <= payload.keys()
    with pytest.raises(CaptionerError, match="already holds a run"):
        train(tiny_config(tiny_coco, run))


def test_a_train_log_written_to_a_file_holds_no_per_batch_progress(tiny_coco, tmp_path):
    save_config(tiny_config(tiny_coco, tmp_path / "run"), tmp_path / "config.yaml")
    log = tmp_path / "train.log"
    with log.open("w") as out:          # as `captioner train ... > train.log 2>&1` (or nohup, or CI) writes it
        done = subprocess.run([sys.executable, "-m", "captioner", "train", str(tmp_path / "config.yaml")],
                              stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text and not re.search(r"\d+/\d+ batch|batch/s|it/s", text), text
    assert re.search(r"^epoch 1/2: .*BLEU-4", text, re.M) and re.search(r"^epoch 2/2: ", text, re.M)   # one a epoch


def test_progress_bars_redraw_on_a_terminal_and_write_whole_lines_elsewhere():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal, log_file = Terminal(), io.StringIO()
    for _ in progress_bar(range(5), file=terminal, desc="epoch 1/2", unit="batch", mininterval=0):
        pass
    assert "\r" in terminal.getvalue() and "5/5" in terminal.getvalue()
    for _ in progress_bar(range(5), file=log_file, desc="epoch 1/2", unit="batch", mininterval=0):
        pass
    lines = log_file.getvalue()
    assert "\r" not in lines and lines.splitlines()[0].startswith("epoch 1/2: 1/5 batch [")
    assert lines.splitlines()[-1].startswith("epoch 1/2: 5/5 batch [")
    quiet = io.StringIO()
    for _ in progress_bar(range(5), file=quiet, show=False):
        pass
    assert quiet.getvalue() == ""


def test_overwrite_replaces_a_run_only_once_the_new_one_can_start(tiny_coco, tmp_path):
    run = tmp_path / "run"
    train(tiny_config(tiny_coco, run, train={"epochs": 1}))
    (run / "scores_test.json").write_text("{}")          # what evaluate wrote about the old model
    before = {name: (run / name).read_bytes() for name in ("last.pt", "best.pt", "metrics.jsonl")}
    broken = tiny_config(tiny_coco, run, train={"epochs": 1})
    broken.data.captions["train"] = str(tmp_path / "missing.json")
    with pytest.raises(CaptionerError, match="missing.json"):
        train(broken, overwrite=True)
    assert {name: (run / name).read_bytes() for name in before} == before     # the old run, untouched
    result = train(tiny_config(tiny_coco, run, train={"epochs": 1}, run={"seed": 1}), overwrite=True)
    assert not (run / "scores_test.json").exists()      # it described the replaced model
    assert (run / "best.pt").read_bytes() != before["best.pt"] and result["step"] == 5
    assert len((run / "metrics.jsonl").read_text().splitlines()) == len(before["metrics.jsonl"].splitlines())


def test_a_run_that_failed_before_its_first_checkpoint_leaves_no_metrics_to_a_new_one(tiny_coco, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"type": "train", "step": 1}\n')   # no checkpoint was saved
    train(tiny_config(tiny_coco, run, train={"epochs": 1}))
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps.count(1) == 1


def test_resume_after_epoch_equals_uninterrupted(tiny_coco, tmp_path):
    train(tiny_config(tiny_coco, tmp_path / "full", train={"epochs": 3}))
    train(tiny_config(tiny_coco, tmp_path / "split", train={"epochs": 1}))
    train(tiny_config(tiny_coco, tmp_path / "split", train={"epochs": 3}), resume=True)
    assert_same_weights(state_of(tmp_path / "full" / "last.pt"), state_of(tmp_path / "split" / "last.pt"))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_mid_epoch_saves_and_resume_equals_uninterrupted(tiny_coco, tmp_path, monkeypatch, sig):
    train(tiny_config(tiny_coco, tmp_path / "full"))
    calls = {"n": 0}
    real_loss = engine.decoder_loss

    def loss_then_signal(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 7:  # step 2 of epoch 2
            os.kill(os.getpid(), sig)
        return real_loss(*args, **kwargs)

    monkeypatch.setattr(engine, "decoder_loss", loss_then_signal)
    result = train(tiny_config(tiny_coco, tmp_path / "split"))
    progress = load_checkpoint(tmp_path / "split" / "last.pt")["progress"]
    assert result["stopped"] and progress["step"] == 7
    monkeypatch.setattr(engine, "decoder_loss", real_loss)
    train(tiny_config(tiny_coco, tmp_path / "split"), resume=True)
    assert_same_weights(state_of(tmp_path / "full" / "last.pt"), state_of(tmp_path / "split" / "last.pt"))
    records = [json.loads(line) for line in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    second = [r for r in records if r["type"] == "val" and r["epoch"] == 2][-1]
    assert 0 < progress["epoch_seconds"] < second["epoch_seconds"]      # the time before the stop counts in the epoch


def test_resuming_a_run_that_stopped_early_trains_no_further(tiny_coco, tmp_path):
    config = tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 4, "early_stopping": 1, "lr": 0.0})
    result = train(config)          # lr 0: no gain after the first epoch, so it stops after the second
    assert result["epochs"] == 2
    resumed = train(config, resume=True)
    assert (resumed["epochs"], resumed["step"]) == (result["epochs"], result["step"])


def test_resume_names_each_setting_that_differs_from_the_runs(tiny_coco, tmp_path, caplog):
    train(tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 1}))
    with caplog.at_level(logging.WARNING, logger="captioner.training.engine"):
        train(tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 2}, loss={"label_smoothing": 0.1}),
              resume=True)
    warned = [r.getMessage() for r in caplog.records if "differ from the run's" in r.getMessage()]
    assert len(warned) == 1 and "train.epochs 1 -> 2" in warned[0] and "loss.label_smoothing 0.0 -> 0.1" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="captioner.training.engine"):
        train(tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 2}, loss={"label_smoothing": 0.1}),
              resume=True)
    assert not [r for r in caplog.records if "differ from the run's" in r.getMessage()]


def test_resume_refuses_another_architecture(tiny_coco, tmp_path):
    train(tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 1}))
    with pytest.raises(CaptionerError, match="different model section .*hidden_dim"):
        train(tiny_config(tiny_coco, tmp_path / "run", model={"lstm": {"hidden_dim": 12}}), resume=True)


@pytest.mark.parametrize("fine_tune_blocks", [0, 1])
def test_gradients_reach_encoder_only_when_fine_tuning(tiny_coco, tmp_path, fine_tune_blocks):
    config = tiny_config(tiny_coco, tmp_path, encoder={"fine_tune_blocks": fine_tune_blocks})
    model = build_model(config, vocab_size=20)
    images = torch.rand(2, 3, 32, 32)
    captions = torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0]])
    out = model(captions, images=images)
    caption_loss(out.logits, captions[:, 1:], out.alpha, 1.0)["loss"].backward()
    encoder_grads = [p.grad for p in model.encoder.parameters() if p.grad is not None]
    assert all(p.grad is not None for p in model.decoder.parameters())
    if fine_tune_blocks:
        assert encoder_grads and any(g.abs().sum() > 0 for g in encoder_grads)
    else:
        assert not encoder_grads


def test_feature_cache_round_trip_resume_and_unreadable(tiny_coco, tmp_path):
    config = tiny_config(tiny_coco, tmp_path)
    model = build_model(config, vocab_size=5).eval()
    records = read_split(config.data, "val")
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    records[-1].path = broken
    transform = image_transform(model.encoder)
    folder = tmp_path / "cache"
    first = build_feature_cache(model.encoder, records[:3], folder, transform=transform, progress=False)
    assert first["written"] == 3
    # A second run over more images is refused (other image set); the same set resumes with nothing to do.
    with pytest.raises(CaptionerError, match="other images"):
        build_feature_cache(model.encoder, records, folder, transform=transform, progress=False)
    again = build_feature_cache(model.encoder, records[:3], folder, transform=transform, progress=False)
    assert again == {"written": 0, "failed": {}, "skipped": 3}
    full = build_feature_cache(model.encoder, records, tmp_path / "cache2", transform=transform, progress=False)
    assert list(full["failed"]) == [str(records[-1].image_id)] and "broken.png" in full["failed"][str(records[-1].image_id)]
    cache = FeatureCache(tmp_path / "cache2")
    assert records[-1].image_id not in cache
    with torch.no_grad():
        for record in records[:-1]:
            direct = model.encoder(transform(load_image(record.path)).unsqueeze(0))[0]
            torch.testing.assert_close(cache[record.image_id], direct, rtol=2e-3, atol=2e-3)
    stored = np.load(tmp_path / "cache2" / "features.npy")          # float16, widened exactly on reading
    for row, image_id in enumerate(cache.meta["image_ids"][:3]):
        read = cache[image_id]
        assert stored.dtype == np.float16 and read.dtype == torch.float32
        assert torch.equal(read, torch.from_numpy(stored[row].astype(np.float32)))
    build_feature_cache(model.encoder, records[:2], tmp_path / "cache32", transform=transform, dtype="float32",
                        progress=False)
    cache32, stored32 = FeatureCache(tmp_path / "cache32"), np.load(tmp_path / "cache32" / "features.npy")
    read = cache32[cache32.meta["image_ids"][0]]
    assert read.dtype == torch.float32 and torch.equal(read, torch.from_numpy(stored32[0]))
    read += 1                                                            # a copy of its own, not the memory map
    assert torch.equal(cache32[cache32.meta["image_ids"][0]], torch.from_numpy(stored32[0]))


def test_a_damaged_feature_cache_is_one_line_and_never_read_as_zeros(tiny_coco, tmp_path):
    config = tiny_config(tiny_coco, tmp_path)
    model = build_model(config, vocab_size=5).eval()
    records = read_split(config.data, "val")
    folder = tmp_path / "cache"
    build = lambda: build_feature_cache(model.encoder, records, folder, transform=image_transform(model.encoder),
                                        progress=False)
    build()
    whole = (folder / "features.npy").read_bytes()
    (folder / "features.npy").write_bytes(whole[:1000])                  # an interrupted copy
    for attempt in (lambda: FeatureCache(folder), build):                # read, or resumed by cache-features
        with pytest.raises(CaptionerError, match=rf"features.npy: truncated \(1000 of {len(whole)} bytes\)"):
            attempt()
    assert (folder / "features.npy").stat().st_size == 1000              # not extended with zeros
    (folder / "features.npy").write_bytes(whole)
    (folder / "status.npy").write_bytes(b"")
    with pytest.raises(CaptionerError, match="status.npy: not a readable NumPy array"):
        FeatureCache(folder)
    (folder / "meta.json").write_text("{bad")
    with pytest.raises(CaptionerError, match="meta.json: malformed JSON"):
        FeatureCache(folder)


def test_train_from_cached_features_then_cli_caption_and_evaluate(tiny_coco, tmp_path, capsys, monkeypatch):
    config = tiny_config(tiny_coco, tmp_path / "run", data={"features": str(tmp_path / "cache")})
    model = build_model(config, vocab_size=5)
    records = [r for s in ("train", "val", "test") for r in read_split(config.data, s)]
    build_feature_cache(model.encoder, records, tmp_path / "cache", transform=image_transform(model.encoder),
                        progress=False, encoder_config=dataclasses.asdict(config.encoder))
    result = train(config)
    checkpoint = result["checkpoint"]
    capsys.readouterr()
    image = tiny_coco / "images" / "test" / "300.png"
    bad = tmp_path / "bad.jpg"
    bad.write_text("hello")
    code = main(["caption", str(image), str(bad), "--checkpoint", checkpoint, "--beam", "2", "--device", "cpu"])
    out = capsys.readouterr()
    assert code == 1
    assert out.out.startswith(f"{image}: ")
    assert out.err.count("\n") == 1 and "bad.jpg" in out.err and "Traceback" not in out.err
    figure = tmp_path / "fig.png"
    assert main(["attend", str(image), "--checkpoint", checkpoint, "--out", str(figure), "--device", "cpu"]) == 0
    assert figure.stat().st_size > 1000
    instances = {"images": [{"id": 300, "file_name": "test/300.png", "width": 32, "height": 32}],
                 "categories": [{"id": 1, "name": "square"}],
                 "annotations": [{"id": 1, "image_id": 300, "category_id": 1, "bbox": [0, 8, 16, 16], "colour": c}
                                 for c in ("red", "green", "blue")]}
    (tmp_path / "instances.json").write_text(json.dumps(instances))
    drawn = {}
    monkeypatch.setattr(attention_figure, "draw_attention_figure", lambda *a, **k: drawn.update(k) or a[3])
    assert main(["attend", str(image), "--checkpoint", checkpoint, "--out", str(figure), "--device", "cpu",
                 "--instances", str(tmp_path / "instances.json")]) == 0
    assert len(drawn["boxes"]) == len(capsys.readouterr().out.splitlines()[0].split(": ")[1].split())
    assert main(["attend", str(bad), "--checkpoint", checkpoint, "--out", str(figure),
                 "--instances", str(tmp_path / "instances.json")]) == 1
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", checkpoint, "--split", "test", "--beam", "2",
                 "--out", str(tmp_path / "eval"), "--device", "cpu"]) == 0
    scores = json.loads((tmp_path / "eval" / "scores_test.json").read_text())
    assert {"BLEU-4", "METEOR", "ROUGE-L", "CIDEr"} <= scores.keys() and scores["images"] == 6
    results = json.loads((tmp_path / "eval" / "captions_test.json").read_text())
    assert sorted(r["image_id"] for r in results) == list(range(300, 306))
    attention = scores["attention"]
    assert attention["regions"] == 4 and attention["mean_entropy"] <= attention["uniform_entropy"] + 1e-6
    assert attention["peak_ratio"] >= 1.0 and "coverage" not in attention
    # COCO instances for one image of the six: the split is scored, that image grounded, the rest counted
    coco_instances = {"images": [{"id": 300, "file_name": "test/300.png", "width": 32, "height": 32}],
                      "categories": [{"id": 18, "name": "dog"}],
                      "annotations": [{"id": 1, "image_id": 300, "category_id": 18, "bbox": [0, 8, 16, 16], "area": 256,
                                       "iscrowd": 0, "segmentation": [[0, 8, 16, 8, 16, 24, 0, 24]]}]}
    (tmp_path / "coco_instances.json").write_text(json.dumps(coco_instances))
    override = "data.instances=" + json.dumps({"test": str(tmp_path / "coco_instances.json")})
    assert main(["evaluate", "--checkpoint", checkpoint, override, "--split", "test", "--beam", "2",
                 "--out", str(tmp_path / "eval2"), "--device", "cpu"]) == 0
    scores = json.loads((tmp_path / "eval2" / "scores_test.json").read_text())
    assert scores["images"] == 6 and "CIDEr" in scores
    assert scores["grounding"]["images_grounded"] == 1 and scores["grounding"]["images_without_objects"] == 5
    capsys.readouterr()   # the model's attention while it reads image 300's two references: one shape word each
    assert main(["ground", "--checkpoint", checkpoint, "--split", "test", "--references",
                 "--instances", str(tmp_path / "instances.json"),
                 "--json", "--device", "cpu", "--out", str(tmp_path / "ground")]) == 0
    grounding = json.loads(capsys.readouterr().out)
    assert grounding["words"] == 2 and grounding["images_grounded"] == 1 and grounding["images_without_objects"] == 5
    assert (tmp_path / "ground" / "grounding_references_test.json").exists()


def test_hard_attention_run_round_trips_and_compare_writes_report(tiny_coco, tmp_path, capsys):
    train(tiny_config(tiny_coco, tmp_path / "soft", train={"epochs": 1}))
    hard = train(tiny_config(tiny_coco, tmp_path / "hard", train={"epochs": 1}, model={"lstm": {"attention_mode": "hard"}}))
    payload = load_checkpoint(hard["checkpoint"])
    assert payload["loss"]["baseline_updates"] > 0  # the REINFORCE baseline was trained and saved with the loss
    caption_and_attend(hard["checkpoint"], tiny_coco / "images" / "test" / "301.png", tmp_path / "h.png", capsys)
    report_dir = tmp_path / "report"
    assert main(["compare", str(tmp_path / "soft"), str(tmp_path / "hard"), "--out", str(report_dir),
                 "--images", "2", "--beam", "2"]) == 0
    html = (report_dir / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2 + 2 * 2  # curves, coverage, 2 images x 2 runs
    markdown = (report_dir / "report.md").read_text()
    assert "| soft |" in markdown and "| hard |" in markdown and "METEOR" in markdown
    assert (tmp_path / "hard" / "scores_test.json").exists()  # evaluated on the way
    for line in markdown.splitlines():
        if line.startswith("!["):
            assert (report_dir / line.split("](")[1].rstrip(")")).exists()


def learning_rates(schedule: str, warmup: int, steps: int, steps_per_epoch: int = 10, epochs: int = 3,
                   overrides: tuple[str, ...] = ()) -> list[float]:
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    config = load_config(None, [f"train.lr_schedule={schedule}", f"train.warmup_steps={warmup}",
                                f"train.epochs={epochs}", "train.lr_gamma=0.5", "train.lr_step_epochs=1", *overrides])
    scheduler = engine.make_scheduler(optimizer, config, steps_per_epoch)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_hard_attention_warm_start_reads_the_expectation_then_samples(tiny_coco, tmp_path):
    hard = {"lstm": {"attention_mode": "hard", "expectation_probability": 0.0}}
    warm = train(tiny_config(tiny_coco, tmp_path / "warm", model=hard, train={"expectation_epochs": 1}))
    steps = [json.loads(line) for line in (tmp_path / "warm" / "metrics.jsonl").read_text().splitlines()]
    reinforce = {epoch: [s["reinforce"] for s in steps if s["type"] == "train" and s["epoch"] == epoch] for epoch in (1, 2)}
    assert reinforce[1] and all(r == 0 for r in reinforce[1])   # no location sampled in the warm-up epoch
    assert any(r != 0 for r in reinforce[2])                    # then every caption samples (probability 0)
    assert load_checkpoint(warm["checkpoint"])["config"]["model"]["lstm"]["expectation_probability"] == 0.0
    # its first epoch is a run whose captions all read the expectation, to the last weight
    one = train(tiny_config(tiny_coco, tmp_path / "one", model=hard, train={"epochs": 1, "expectation_epochs": 1}))
    always = {"lstm": {"attention_mode": "hard", "expectation_probability": 1.0}}
    other = train(tiny_config(tiny_coco, tmp_path / "always", model=always, train={"epochs": 1}))
    first, second = (load_checkpoint(r["checkpoint"].replace("best", "last"))["model"] for r in (one, other))
    for name, weight in first.items():
        torch.testing.assert_close(weight, second[name], rtol=0, atol=0)


def test_the_papers_switch_per_minibatch_holds_for_the_whole_run(tiny_coco, tmp_path):
    """``capgen.py``'s training: each step reads alpha's expectation with probability 0.5, drawn once for all its
    captions, in every epoch (not a warm start that ends)."""
    paper = {"lstm": {"attention_mode": "hard", "expectation_probability": 0.5, "expectation_draw": "batch"}}
    train(tiny_config(tiny_coco, tmp_path, model=paper, train={"epochs": 4, "expectation_epochs": 0}))
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    reinforce = [s["reinforce"] for s in steps if s["type"] == "train"]
    on_expectation = [r == 0 for r in reinforce]                  # no location sampled in that step
    half = len(reinforce) // 2
    for part in (on_expectation[:half], on_expectation[half:]):  # both kinds of step, early and late in the run
        assert any(part) and not all(part)


def test_learning_rate_schedules_per_step():
    warm = learning_rates("rsqrt", warmup=4, steps=16)
    assert warm[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])                     # linear warm-up
    assert warm[15] == pytest.approx((4 / 16) ** 0.5)                             # then sqrt(warmup / step)
    cosine = learning_rates("cosine", warmup=0, steps=30)
    assert cosine[0] == 1.0 and cosine[15] == pytest.approx(0.5) and cosine[-1] < 0.01
    # an SCST run's cosine spans its cross-entropy epochs (2 of the 3 here), not the self-critical ones after them
    before_scst = learning_rates("cosine", warmup=0, steps=20, overrides=("train.objective=scst",
                                                                         "train.scst_after_epoch=2"))
    assert before_scst[10] == pytest.approx(0.5) and before_scst[-1] < 0.01
    # all 3 epochs where SCST starts later than the run ends, from the first epoch, or the run is not SCST
    for overrides in (("train.objective=scst", "train.scst_after_epoch=5"), ("train.objective=scst",
                      "train.scst_after_epoch=0"), ("train.objective=xe", "train.scst_after_epoch=2")):
        assert learning_rates("cosine", warmup=0, steps=16, overrides=overrides)[15] == pytest.approx(0.5)
    assert learning_rates("step", warmup=0, steps=21)[::10] == pytest.approx([1.0, 0.5, 0.25])
    with pytest.raises(CaptionerError, match="lr_schedule"):
        learning_rates("linear", warmup=0, steps=1)


def scripted_validation(*scores: float):
    """A stand-in for ``engine.validate`` whose CIDEr is the next of ``scores`` at each epoch's end."""
    upcoming = iter(scores)
    return lambda *args, **kwargs: {"CIDEr": next(upcoming)}


def test_plateau_decays_the_learning_rate_after_epochs_without_gain_and_resumes_exactly(tiny_coco, tmp_path,
                                                                                        monkeypatch):
    plateau = {"lr_schedule": "plateau", "lr_patience": 1, "lr_gamma": 0.5, "lr": 0.01, "epochs": 5}
    scores = (0.5, 0.4, 0.3, 0.6, 0.2)         # no gain after epochs 2, 3 and 5: a decay after each
    monkeypatch.setattr(engine, "validate", scripted_validation(*scores))
    train(tiny_config(tiny_coco, tmp_path / "full", train=plateau))
    steps = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    rates = {r["epoch"]: r["lr"] for r in steps if r["type"] == "train"}
    assert rates == pytest.approx({1: 0.01, 2: 0.01, 3: 0.005, 4: 0.0025, 5: 0.0025})
    monkeypatch.setattr(engine, "validate", scripted_validation(*scores[:3]))
    train(tiny_config(tiny_coco, tmp_path / "split", train={**plateau, "epochs": 3}))
    monkeypatch.setattr(engine, "validate", scripted_validation(*scores[3:]))
    train(tiny_config(tiny_coco, tmp_path / "split", train=plateau), resume=True)
    full, split = (load_checkpoint(tmp_path / name / "last.pt") for name in ("full", "split"))
    assert all(torch.equal(full["model"][k], split["model"][k]) for k in full["model"])
    assert full["optimizer"]["param_groups"][0]["lr"] == split["optimizer"]["param_groups"][0]["lr"] == 0.00125


def test_hard_attention_keeps_the_best_sampled_epoch_and_waits_out_its_warm_start(tiny_coco, tmp_path, monkeypatch):
    """The warm epochs train soft attention: they neither end the run early nor stay best.pt after an epoch that
    sampled locations, though it scores less; a soft run with the same scores keeps its first epoch and stops."""
    hard = {"lstm": {"attention_mode": "hard"}}
    stopping = {"early_stopping": 1, "epochs": 5}
    scores = (0.5, 0.4, 0.3, 0.2, 0.1)      # falling: early stopping would end the run after epoch 2
    monkeypatch.setattr(engine, "validate", scripted_validation(*scores))
    run = train(tiny_config(tiny_coco, tmp_path / "hard", model=hard, train={**stopping, "expectation_epochs": 2}))
    assert run["epochs"] == 4 and run["best"] == 0.3                # the warm 2, then the best sampled and 1 more
    assert load_checkpoint(tmp_path / "hard" / "best.pt")["progress"]["epoch"] == 3
    monkeypatch.setattr(engine, "validate", scripted_validation(*scores))
    run = train(tiny_config(tiny_coco, tmp_path / "soft", train={**stopping, "expectation_epochs": 2}))
    assert run["epochs"] == 2 and run["best"] == 0.5
    assert load_checkpoint(tmp_path / "soft" / "best.pt")["progress"]["epoch"] == 1


def test_transformer_run_trains_captions_and_joins_the_comparison(tiny_coco, tmp_path, capsys):
    model = {"decoder": "transformer", "transformer": {"d_model": 16, "num_layers": 1, "num_heads": 2, "ffn_dim": 32,
                                                      "region_position": "learned", "max_length": 16}}
    run = train(tiny_config(tiny_coco, tmp_path / "transformer", model=model, loss={"doubly_stochastic": 0.0,
                                                                                    "label_smoothing": 0.1},
                            train={"epochs": 1, "lr_schedule": "rsqrt", "warmup_steps": 2}))
    train(tiny_config(tiny_coco, tmp_path / "soft", train={"epochs": 1}))
    image = tiny_coco / "images" / "test" / "302.png"
    capsys.readouterr()
    assert main(["caption", str(image), "--checkpoint", run["checkpoint"], "--json", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["image"] == str(image)
    assert main(["attend", str(image), "--checkpoint", run["checkpoint"], "--out", str(tmp_path / "t.png"),
                 "--device", "cpu"]) == 0
    assert main(["compare", str(tmp_path / "soft"), str(tmp_path / "transformer"), "--out", str(tmp_path / "report"),
                 "--images", "1", "--beam", "2"]) == 0
    assert "| transformer |" in (tmp_path / "report" / "report.md").read_text()


def test_data_vocab_writes_the_file_that_training_then_uses(tiny_coco, tmp_path, capsys):
    config = tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 1}, data={"vocab_min_count": 2})
    save_config(config, tmp_path / "config.yaml")
    capsys.readouterr()
    assert main(["data", "vocab", str(tmp_path / "config.yaml"), "--out", str(tmp_path / "vocab.json")]) == 0
    report = json.loads(capsys.readouterr().out)
    written = json.loads((tmp_path / "vocab.json").read_text())
    words, counts = written["words"], written["counts"]
    assert report["words"] == len(words) and report["train_captions"] == 24 and 0 < report["token_coverage"] <= 1
    assert counts[2] == 24 and len(counts) == len(words)                   # <end>: one per caption
    shorter = words[:-1]
    (tmp_path / "vocab.json").write_text(json.dumps({"words": shorter}))   # a file without counts: counted again
    train(tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 1}, data={"vocab": str(tmp_path / "vocab.json")}))
    kept = load_checkpoint(tmp_path / "run" / "last.pt")["vocab"]
    assert kept["words"] == shorter and kept["counts"][4:] == counts[4:-1]
    assert kept["counts"][3] == counts[3] + counts[-1]                     # the word left out is now <unk>'s


def test_mirror_cache_holds_the_flipped_images_and_mirrored_items_swap_left_and_right(tiny_coco, tmp_path, capsys):
    from captioner.data.dataset import make_dataset
    from captioner.data.vocabulary import Vocabulary

    config = tiny_config(tiny_coco, tmp_path / "run", data={"features": str(tmp_path / "cache")})
    save_config(config, tmp_path / "config.yaml")
    records = read_split(config.data, "train")
    vocab = Vocabulary.build([c for r in records for c in r.captions], min_count=1)
    model = build_model(config, vocab_size=len(vocab)).eval()
    transform = image_transform(model.encoder)
    assert main(["cache-features", str(tmp_path / "config.yaml"), "--splits", "train"]) == 0
    with pytest.raises(CaptionerError, match=r"cache/mirrored: no mirror cache for data.mirror; run"):
        make_dataset(config.data, records, vocab, model.encoder, pairs=True, mirrored=True)
    assert main(["cache-features", str(tmp_path / "config.yaml"), "--splits", "train", "--mirrored"]) == 0
    assert "cache/mirrored: 12 images written" in capsys.readouterr().out
    mirrored = FeatureCache(tmp_path / "cache" / "mirrored")
    assert mirrored.meta["mirrored"] is True and "mirrored" not in FeatureCache(tmp_path / "cache").meta
    with torch.no_grad():
        for record in records[:3]:
            flipped = transform(load_image(record.path).transpose(0))       # PIL's FLIP_LEFT_RIGHT
            torch.testing.assert_close(mirrored[record.image_id], model.encoder(flipped[None])[0], rtol=2e-3, atol=2e-3)
    pairs = make_dataset(config.data, records, vocab, model.encoder, pairs=True, mirrored=True)
    n = len(pairs)
    swap = {"left": "right", "right": "left"}
    for i in range(n):
        plain, mirror = pairs[i], pairs[i + n]
        assert mirror["index"] == plain["index"] and mirror["image_id"] == plain["image_id"]
        assert torch.equal(mirror["visual"], mirrored[plain["image_id"]])
        words = vocab.decode(plain["caption"]).split()
        assert vocab.decode(mirror["caption"]).split() == [swap.get(w, w) for w in words]
    assert any("left" in vocab.decode(pairs[i]["caption"]) for i in range(n))
    with pytest.raises(IndexError):
        pairs[2 * n]
    images = make_dataset(dataclasses.replace(config.data, features=None), records, vocab, model.encoder, pairs=True)
    flipped = transform(load_image(records[0].path).transpose(0))
    torch.testing.assert_close(images[n]["visual"], flipped, rtol=0, atol=1e-5)   # a flipped tensor, as if flipped first
    (tmp_path / "cache" / "mirrored" / "meta.json").write_text(
        (tmp_path / "cache" / "meta.json").read_text())       # a cache of the images as they are in its place
    with pytest.raises(CaptionerError, match="mirrored/meta.json: a cache of images as they are, not mirrored"):
        make_dataset(config.data, records, vocab, model.encoder, pairs=True, mirrored=True)


def test_training_with_mirrored_items_makes_its_mirror_cache_and_resumes_exactly(tiny_coco, tmp_path, caplog):
    data = {"features": str(tmp_path / "cache"), "mirror": 0.5}
    with caplog.at_level(logging.INFO, logger="captioner.training.engine"):
        train(tiny_config(tiny_coco, tmp_path / "full", data=data, train={"epochs": 2}))
    assert f"each caption's photo mirrored with chance 0.5 (from {tmp_path / 'cache' / 'mirrored'})" in caplog.text
    cache = FeatureCache(tmp_path / "cache" / "mirrored")
    assert cache.meta["splits"] == ["train"] and len(cache.meta["image_ids"]) == 12
    train(tiny_config(tiny_coco, tmp_path / "split", data=data, train={"epochs": 1}))
    train(tiny_config(tiny_coco, tmp_path / "split", data=data, train={"epochs": 2}), resume=True)
    assert_same_weights(state_of(tmp_path / "full" / "last.pt"), state_of(tmp_path / "split" / "last.pt"))
    plain = tiny_config(tiny_coco, tmp_path / "plain", data={"features": str(tmp_path / "cache")}, train={"epochs": 2})
    train(plain)
    before, after = state_of(tmp_path / "plain" / "last.pt"), state_of(tmp_path / "full" / "last.pt")
    assert any(not torch.equal(before[k], after[k]) for k in before)      # the mirrored items were trained on


def test_cache_features_precision_is_a_choice(tiny_coco, tmp_path, capsys):
    config = tiny_config(tiny_coco, tmp_path / "run", data={"features": str(tmp_path / "cache")})
    save_config(config, tmp_path / "config.yaml")
    assert main(["cache-features", str(tmp_path / "config.yaml"), "--splits", "test", "--dtype", "float32"]) == 0
    cache = FeatureCache(tmp_path / "cache")
    assert cache.meta["dtype"] == "float32" and str(cache.features.dtype) == "float32"


def test_cache_features_names_unreadable_images_caches_the_rest_and_exits_1(tiny_coco, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(tiny_coco, data)
    (data / "images" / "test" / "300.png").write_text("broken")
    config = tiny_config(data, tmp_path / "run", data={"features": str(tmp_path / "cache")})
    save_config(config, tmp_path / "config.yaml")
    assert main(["cache-features", str(tmp_path / "config.yaml"), "--splits", "test"]) == 1
    out = capsys.readouterr()
    assert "5 images written" in out.out and "1 unreadable" in out.out and "300.png" in out.err
    assert sum(image_id in FeatureCache(tmp_path / "cache") for image_id in range(300, 306)) == 5


def test_output_layer_fine_tuning_changes_out_words_alone_and_resumes_exactly(tiny_coco, tmp_path):
    start = train(tiny_config(tiny_coco, tmp_path / "xe", train={"epochs": 1}))["checkpoint"]
    tune = {"init_from": start, "trainable": "output", "product_weight": 0.5, "lr": 0.01, "epochs": 2}
    train(tiny_config(tiny_coco, tmp_path / "full", train=tune))
    before, after = state_of(start), state_of(tmp_path / "full" / "last.pt")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"decoder.out_words.weight", "decoder.out_words.bias"}
    train(tiny_config(tiny_coco, tmp_path / "split", train={**tune, "epochs": 1}))
    train(tiny_config(tiny_coco, tmp_path / "split", train=tune), resume=True)  # its partner: init_from's weights again
    assert_same_weights(after, state_of(tmp_path / "split" / "last.pt"))


def test_product_of_experts_loss_is_the_cross_entropy_of_the_summed_logits(tiny_coco, tmp_path):
    start = train(tiny_config(tiny_coco, tmp_path / "xe", train={"epochs": 1}))["checkpoint"]
    config = tiny_config(tiny_coco, tmp_path / "tuned", loss={"doubly_stochastic": 0.0},
                         train={"init_from": start, "trainable": "output", "product_weight": 0.5})
    config, initial = engine.initial_checkpoint(config)
    run = engine.build_run(config, engine.World(), torch.device("cpu"), None, initial)
    with torch.no_grad():
        run.model.decoder.out_words.weight.add_(torch.randn_like(run.model.decoder.out_words.weight))  # not its start
    run.model.eval()                   # no dropout: the same pass twice
    batch = next(iter(run.loaders["xe"]))
    captions = batch["captions"]
    inputs = engine.visual_inputs(batch, run.device, channels_last=False)
    model_logits, start_logits = run.model(captions, **inputs).logits, run.start(captions, **inputs).logits
    targets = captions[:, 1:][captions[:, 1:] != 0]
    product = torch.nn.functional.cross_entropy(model_logits + 0.5 * start_logits, targets)
    alone = torch.nn.functional.cross_entropy(model_logits, targets)
    loss = engine.decoder_loss(run, batch)["loss"]
    torch.testing.assert_close(loss, product)
    assert not torch.allclose(loss, alone)
    assert not run.start.training and not any(p.requires_grad for p in run.start.parameters())
    assert [n for n, p in run.model.named_parameters() if p.requires_grad] == ["decoder.out_words.weight",
                                                                                 "decoder.out_words.bias"]


def test_output_layer_fine_tuning_unties_a_transformers_output_layer_from_its_frozen_embedding(tiny_coco, tmp_path):
    model = {"decoder": "transformer", "transformer": {"d_model": 16, "num_layers": 1, "num_heads": 2, "ffn_dim": 32,
                                                      "max_length": 16, "tie_embeddings": True}}
    loss = {"doubly_stochastic": 0.0}
    start = train(tiny_config(tiny_coco, tmp_path / "xe", model=model, loss=loss, train={"epochs": 1}))["checkpoint"]
    tune = {"init_from": start, "trainable": "output", "product_weight": 0.5, "lr": 0.01, "epochs": 1}
    tuned = train(tiny_config(tiny_coco, tmp_path / "tuned", loss=loss, train=tune))["checkpoint"]
    before, after = state_of(start), state_of(tuned)
    torch.testing.assert_close(before["decoder.out_words.weight"], before["decoder.embedding.weight"], rtol=0, atol=0)
    assert {k for k in before if not torch.equal(before[k], after[k])} == {"decoder.out_words.weight",
                                                                           "decoder.out_words.bias"}
    payload = load_checkpoint(tuned)
    assert payload["config"]["model"]["transformer"]["tie_embeddings"] is False
    assert main(["caption", str(tiny_coco / "images" / "test" / "302.png"), "--checkpoint", tuned, "--device",
                 "cpu"]) == 0
    rebuilt = build_model(load_config(tmp_path / "tuned" / "config.yaml"), len(payload["vocab"]["words"]))
    rebuilt.load_state_dict(after)
    assert_same_weights(rebuilt.state_dict(), after)       # loads as two layers: the tuned output layer kept
    with pytest.raises(CaptionerError, match="tied embeddings"):
        train(tiny_config(tiny_coco, tmp_path / "fresh", model=model, loss=loss,
                          train={"trainable": "output", "epochs": 1}))


def test_product_of_experts_needs_a_start_and_one_word_distribution_per_step(tiny_coco, tmp_path):
    with pytest.raises(CaptionerError, match="train.product_weight needs train.init_from"):
        train(tiny_config(tiny_coco, tmp_path / "run", train={"product_weight": 0.1}))
    start = train(tiny_config(tiny_coco, tmp_path / "hard", model={"lstm": {"attention_mode": "hard"}},
                              train={"epochs": 1}))["checkpoint"]
    with pytest.raises(CaptionerError, match="not hard or variational attention"):
        train(tiny_config(tiny_coco, tmp_path / "run", train={"product_weight": 0.1, "init_from": start}))
