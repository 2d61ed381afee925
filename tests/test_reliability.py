"""Reliability and security: bad images through the CLI, unreadable training images, crafted and
mismatched checkpoints, kills during saves and mid-epoch, non-finite losses, full disks.

Each test fails when its protection is removed: without the header check the bomb is decoded, without
``weights_only`` the marker file appears, without the atomic rename the killed save leaves a torn file.
"""

import errno
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from captioner.checkpoint import build_model, load_checkpoint, load_model, model_and_loss_states, save_checkpoint
from captioner.cli import main
from captioner.config import complete, load_config, save_config
from captioner.core.files import write_file
from captioner.errors import CaptionerError
from captioner.predictor import Predictor
from captioner.training import engine
from captioner.training.engine import train
from tests.conftest import tiny_config
from tests.test_images import png_header_only

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def checkpoint(tiny_coco, tmp_path_factory):
    run = tmp_path_factory.mktemp("reliability") / "run"
    return Path(train(tiny_config(tiny_coco, run, train={"epochs": 1}))["checkpoint"])


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def one_line_errors(stderr: str) -> list[str]:
    """The error lines of a command's stderr (progress bars aside), after checking there is no traceback."""
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.startswith("captioner: error")]


def test_cli_captions_good_images_and_names_each_bad_one(checkpoint, tmp_path, capsys):
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8))
    good = {"rgb.png": rgb, "gray.png": rgb.convert("L"), "rgba.png": rgb.convert("RGBA"),
            "palette.png": rgb.convert("P"), "cmyk.jpg": rgb.convert("CMYK"),
            "sixteen_bit.png": Image.fromarray((rng.integers(0, 65535, (40, 56))).astype(np.uint16))}
    for name, image in good.items():
        image.save(tmp_path / name)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees
    rgb.save(tmp_path / "rotated.jpg", exif=exif)
    good["rotated.jpg"] = None
    (tmp_path / "empty.jpg").write_bytes(b"")
    rgb.save(tmp_path / "whole.jpg")
    (tmp_path / "truncated.jpg").write_bytes((tmp_path / "whole.jpg").read_bytes()[:300])
    (tmp_path / "text.jpg").write_text("not an image\n")
    png_header_only(tmp_path / "bomb.png", 30_000, 30_000)  # 900 megapixels claimed, no pixel data
    rgb.resize((1, 1)).save(tmp_path / "one_pixel.png")     # readable, but every region of the grid would see one pixel
    bad = ["empty.jpg", "truncated.jpg", "text.jpg", "bomb.png", "missing.png", "one_pixel.png"]
    paths = [str(tmp_path / name) for name in [*good, *bad]]

    capsys.readouterr()
    code = main(["caption", *paths, "--checkpoint", str(checkpoint), "--json", "--device", "cpu"])
    out = capsys.readouterr()
    assert code == 1
    captioned = [json.loads(line)["image"] for line in out.out.splitlines()]
    assert captioned == [str(tmp_path / name) for name in good]
    errors = one_line_errors(out.err)
    assert len(errors) == len(bad)
    for line, name in zip(errors, bad):
        assert line.startswith(f"captioner: error: {tmp_path / name}: ")
    assert "pixels" in errors[3] and "limit" in errors[3]
    assert "1x1 pixels is too small to caption" in errors[5]

    # The pixel limit is configurable: a 56x40 image is refused under a 1000-pixel limit.
    code = main(["caption", str(tmp_path / "rgb.png"), "--checkpoint", str(checkpoint), "--max-pixels", "1000"])
    errors = one_line_errors(capsys.readouterr().err)
    assert code == 1 and len(errors) == 1 and "over the limit of 1000 pixels" in errors[0]


def test_evaluate_names_each_unreadable_image_scores_the_rest_and_exits_1(checkpoint, tiny_coco, tmp_path, capsys, caplog,
                                                                         monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(tiny_coco, data)
    (data / "images" / "test" / "300.png").write_text("broken")
    (data / "images" / "test" / "301.png").unlink()
    images = f"data.images.test={data / 'images'}"
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--split", "test", "--out", str(tmp_path / "eval"),
                 images]) == 1
    out = capsys.readouterr()
    scores = json.loads((tmp_path / "eval" / "scores_test.json").read_text())
    assert scores["images"] == 4 and sorted(map(Path, scores["unreadable_images"])) == [
        data / "images" / "test" / "300.png", data / "images" / "test" / "301.png"]
    assert "Traceback" not in out.err and "2 unreadable image(s) skipped" in out.err
    assert sum("skipped unreadable image" in r.getMessage() and "/test/30" in r.getMessage() for r in caplog.records) == 2
    for name in ("302.png", "303.png", "304.png", "305.png"):
        (data / "images" / "test" / name).unlink()
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--split", "test", "--out", str(tmp_path / "eval"),
                 images]) == 1
    (error,) = one_line_errors(capsys.readouterr().err)
    assert "no image of split 'test' could be read (6 unreadable" in error
    monkeypatch.setattr(Predictor, "generate", None)              # the file is checked before any decoding
    assert main(["ground", "--checkpoint", str(checkpoint), "--split", "test",
                 f"data.instances.test={tmp_path / 'nowhere.json'}"]) == 1
    (error,) = one_line_errors(capsys.readouterr().err)
    assert error == f"captioner: error: {tmp_path / 'nowhere.json'}: instances file not found (data.instances)"


def test_unreadable_training_images_are_skipped_and_listed_or_fatal_with_strict(tiny_coco, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(tiny_coco, data)
    (data / "images" / "train" / "101.png").write_text("broken")
    (data / "images" / "train" / "102.png").unlink()
    config = tiny_config(data, tmp_path / "run", train={"epochs": 2})
    result = train(config)
    assert result["skipped_images"] == 2 and result["epochs"] == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    skipped = sorted(r["error"].split(":")[0] for r in records if r["type"] == "skipped_image")
    assert skipped == [str(data / "images" / "train" / f"{i}.png") for i in (101, 102)]  # listed once each

    save_config(config, tmp_path / "config.yaml")
    capsys.readouterr()
    code = main(["train", str(tmp_path / "config.yaml"), "--strict", "--overwrite", "--no-wandb"])
    errors = one_line_errors(capsys.readouterr().err)
    assert code == 1 and len(errors) == 1 and "images/train/10" in errors[0]


def test_a_training_where_no_image_can_be_read_fails_and_saves_no_untrained_best(tiny_coco, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_coco, data)
    for image in (data / "images" / "train").glob("*.png"):
        image.write_text("broken")
    with pytest.raises(CaptionerError, match="a whole epoch without one training step.*12 unreadable images"):
        train(tiny_config(data, tmp_path / "run", train={"epochs": 1}))
    assert not (tmp_path / "run" / "best.pt").exists() and not (tmp_path / "run" / "last.pt").exists()


def test_crafted_checkpoint_is_refused_and_runs_no_code(tmp_path, capsys):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    crafted = tmp_path / "crafted.pt"
    torch.save({"model": Payload(), "vocab": [], "config": {}}, crafted)
    with pytest.raises(CaptionerError, match="crafted.pt: refused"):
        load_checkpoint(crafted)
    image = tmp_path / "image.png"
    Image.new("RGB", (8, 8)).save(image)
    assert main(["caption", str(image), "--checkpoint", str(crafted)]) == 1
    errors = one_line_errors(capsys.readouterr().err)
    assert len(errors) == 1 and "crafted.pt: refused" in errors[0]
    assert not marker.exists()
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CaptionerError, match="garbage.pt: not a readable checkpoint"):
        load_checkpoint(tmp_path / "garbage.pt")


@pytest.mark.parametrize("damage, message", [
    ("flip", r"damaged: archive/data/\S+ fails its checksum"),       # torch would load it as another model
    ("truncate", "truncated or damaged"),
    ("empty", r"file is empty \(0 bytes\)"),
    ("text", "not a readable checkpoint"),                           # KeyError inside torch's unpickler
    ("folder", "is a folder, neither a checkpoint file nor an exported model"),
])
def test_a_damaged_checkpoint_file_is_one_line_naming_it(checkpoint, tmp_path, capsys, damage, message):
    data = checkpoint.read_bytes()
    damaged = tmp_path / "damaged.pt"
    if damage == "flip":
        with zipfile.ZipFile(checkpoint) as archive:     # the largest weight: flipped bytes inside its data
            member = max(archive.infolist(), key=lambda info: info.file_size)
        start = member.header_offset + 30 + len(member.filename) + len(member.extra) + member.file_size // 2
        data = data[:start] + bytes(b ^ 0xFF for b in data[start:start + 64]) + data[start + 64:]
        damaged.write_bytes(data)
    elif damage == "truncate":
        damaged.write_bytes(data[:len(data) // 2])
    elif damage == "empty":
        damaged.write_bytes(b"")
    elif damage == "text":
        damaged.write_text("junk\n")
    else:
        damaged.mkdir()
    with pytest.raises(CaptionerError, match=rf"^{re.escape(str(damaged))}: {message}"):
        load_checkpoint(damaged)
    image = tmp_path / "image.png"
    Image.new("RGB", (8, 8)).save(image)
    assert main(["caption", str(image), "--checkpoint", str(damaged)]) == 1
    assert len(one_line_errors(capsys.readouterr().err)) == 1


def test_a_device_torch_knows_but_this_machine_lacks_is_named_as_the_device(checkpoint, tmp_path, capsys):
    image = tmp_path / "image.png"
    Image.new("RGB", (8, 8)).save(image)
    for device in ("mps", "cpu:3", "cuda:7" if torch.cuda.is_available() else "cuda"):
        assert main(["caption", str(image), "--checkpoint", str(checkpoint), "--device", device]) == 1
        (error,) = one_line_errors(capsys.readouterr().err)
        assert error.startswith("captioner: error: run.device") and str(checkpoint) not in error


def test_checkpoint_of_another_architecture_or_vocabulary_gives_a_clear_message(checkpoint, tmp_path):
    payload = load_checkpoint(checkpoint)
    other = json.loads(json.dumps(payload["config"]))
    other["model"]["lstm"]["hidden_dim"] = 24
    save_checkpoint({**payload, "config": other}, tmp_path / "arch.pt")
    with pytest.raises(CaptionerError, match=r"arch.pt: weights do not fit the architecture"):
        load_model(tmp_path / "arch.pt")
    vocab = payload["vocab"]
    shorter = {**vocab, "words": vocab["words"][:-2]} if isinstance(vocab, dict) else vocab[:-2]
    save_checkpoint({**payload, "vocab": shorter}, tmp_path / "vocab.pt")
    with pytest.raises(CaptionerError, match=r"vocab.pt: .*vocabulary"):
        load_model(tmp_path / "vocab.pt")


def run_child(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter with this process's thread count (float sums depend on it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(torch.get_num_threads())}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_kill_during_a_save_leaves_the_previous_checkpoint_intact(tmp_path):
    path = tmp_path / "last.pt"
    old = {"model": {"w": torch.arange(4.0)}, "vocab": ["a"], "config": {"n": 1}}
    save_checkpoint(old, path)
    child = run_child("""
        import os, signal, sys, torch
        from captioner import checkpoint

        def torn_save(payload, handle):  # half of a real file, then the process dies
            handle.write(b"PK" + b"x" * 4096)
            handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        checkpoint.torch.save = torn_save
        checkpoint.save_checkpoint({"model": {"w": torch.zeros(4)}, "vocab": [], "config": {}}, sys.argv[1])
    """, str(path))
    assert child.returncode == -signal.SIGKILL
    assert torch.equal(load_checkpoint(path)["model"]["w"], old["model"]["w"])


def test_kill_9_mid_epoch_then_resume_equals_uninterrupted(tiny_coco, tmp_path):
    overrides = {"train": {"checkpoint_every": 3}}
    train(tiny_config(tiny_coco, tmp_path / "full", **overrides))
    config = tiny_config(tiny_coco, tmp_path / "killed", **overrides)
    save_config(config, tmp_path / "config.yaml")
    child = run_child("""
        import os, signal, sys
        from captioner.config import load_config
        from captioner.training import engine

        real_loss, calls = engine.decoder_loss, [0]

        def loss_then_kill(*args, **kwargs):
            calls[0] += 1
            if calls[0] == 8:  # step 3 of epoch 2, after the checkpoint of step 6
                os.kill(os.getpid(), signal.SIGKILL)
            return real_loss(*args, **kwargs)

        engine.decoder_loss = loss_then_kill
        engine.train(load_config(sys.argv[1]))
    """, str(tmp_path / "config.yaml"))
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert load_checkpoint(tmp_path / "killed" / "last.pt")["progress"]["step"] == 6
    result = train(config, resume=True)
    assert result["step"] == 10
    assert same_weights(load_checkpoint(tmp_path / "full" / "last.pt")["model"],
                        load_checkpoint(tmp_path / "killed" / "last.pt")["model"])


def nan_at(monkeypatch, call: int) -> None:
    real_loss, calls = engine.decoder_loss, [0]

    def loss(*args, **kwargs):
        calls[0] += 1
        losses = real_loss(*args, **kwargs)
        if calls[0] == call:
            losses["loss"] = losses["loss"] * float("nan")
        return losses

    monkeypatch.setattr(engine, "decoder_loss", loss)


def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tiny_coco, tmp_path, monkeypatch):
    nan_at(monkeypatch, 4)
    run = tmp_path / "run"
    with pytest.raises(CaptionerError, match=r"non-finite loss \(nan\) at step 4, epoch 1"):
        train(tiny_config(tiny_coco, run, train={"checkpoint_every": 2}))
    kept = load_checkpoint(run / "last.pt")
    assert kept["progress"]["step"] == 2
    assert all(torch.isfinite(v).all() for v in kept["model"].values() if v.is_floating_point())


def test_nonfinite_loss_skips_the_batch_when_configured(tiny_coco, tmp_path, monkeypatch):
    nan_at(monkeypatch, 4)
    result = train(tiny_config(tiny_coco, tmp_path / "run", train={"nonfinite": "skip"}))
    assert result["step"] == 9 and result["epochs"] == 2  # 10 batches, one skipped
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "skipped_batch"] == [4]
    model = load_checkpoint(tmp_path / "run" / "last.pt")["model"]
    assert all(torch.isfinite(v).all() for v in model.values() if v.is_floating_point())


def test_full_disk_gives_one_line_and_leaves_earlier_checkpoints_intact(tiny_coco, tmp_path, monkeypatch, capsys):
    config = tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 1})
    train(config)
    before = {name: (tmp_path / "run" / name).read_bytes() for name in ("last.pt", "best.pt")}
    real_save = torch.save

    def save_until_full(payload, handle, *args, **kwargs):
        handle.write(b"PK" + b"\0" * 1024)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", save_until_full)
    save_config(tiny_config(tiny_coco, tmp_path / "run", train={"epochs": 2}), tmp_path / "config.yaml")
    capsys.readouterr()
    assert main(["train", str(tmp_path / "config.yaml"), "--resume", "--no-wandb"]) == 1
    errors = one_line_errors(capsys.readouterr().err)
    assert len(errors) == 1 and "last.pt: cannot write checkpoint (No space left on device)" in errors[0]
    monkeypatch.setattr(torch, "save", real_save)
    assert {name: (tmp_path / "run" / name).read_bytes() for name in before} == before
    assert not list((tmp_path / "run").glob("*.tmp")) and not list((tmp_path / "run").glob(".*.tmp"))


def test_an_output_that_cannot_be_written_is_one_line_and_the_old_file_stays(checkpoint, tmp_path, capsys, monkeypatch):
    image = tmp_path / "image.png"
    Image.new("RGB", (32, 32), "red").save(image)
    figure = tmp_path / "fig.png"
    assert main(["attend", str(image), "--checkpoint", str(checkpoint), "--out", str(figure)]) == 0
    good = figure.read_bytes()

    def disk_fills(handle):
        handle.write(good[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(CaptionerError, match=rf"^{re.escape(str(figure))}: cannot write \(No space left on device\)"):
        write_file(figure, disk_fills)
    assert figure.read_bytes() == good and [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    capsys.readouterr()
    assert main(["attend", str(image), "--checkpoint", str(checkpoint), "--out", str(image / "fig.png")]) == 1
    (error,) = one_line_errors(capsys.readouterr().err)
    assert error.endswith(f"{image} is a file, not a folder")
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--out", str(image)]) == 1
    (error,) = one_line_errors(capsys.readouterr().err)
    assert error == f"captioner: error: {image}: is a file, not a folder"


def test_a_resumed_run_does_not_write_onto_a_torn_metrics_line(tmp_path):
    from captioner.training.run_io import MetricsLogger

    (tmp_path / "metrics.jsonl").write_text('{"type": "train", "step": 1}\n{"type": "tra')   # killed mid-write
    MetricsLogger(tmp_path, load_config(None, ["train.wandb=disabled"])).log({"type": "train", "step": 2})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]


def test_attend_refuses_a_second_checkpoint_instead_of_using_the_last(checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["attend", str(tmp_path / "a.png"), "--checkpoint", str(checkpoint), "--checkpoint", str(checkpoint),
              "--out", str(tmp_path / "f.png")])
    assert refused.value.code == 2 and "argument --checkpoint: given twice" in capsys.readouterr().err


def test_an_image_named_like_an_override_is_an_image(checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Image.new("RGB", (32, 32), "red").save(tmp_path / "shot.v=1.png")
    assert main(["caption", "shot.v=1.png", "--checkpoint", str(checkpoint), "decode.max_length=3"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("shot.v=1.png: ") and "error" not in out.err
    assert 1 <= len(out.out.strip().split(": ", 1)[1].split()) <= 3    # the override still applies


def test_a_reader_that_goes_away_stops_the_command_quietly(checkpoint, tmp_path):
    image = tmp_path / "image.png"
    Image.new("RGB", (32, 32), "red").save(image)
    command = [sys.executable, "-m", "captioner", "caption", str(image), "--checkpoint", str(checkpoint)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    process.stdout.close()           # like `| head -c 0`: gone before the first line is written
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 128 + signal.SIGPIPE
    assert "Traceback" not in stderr and "error" not in stderr.lower() and "Exception ignored" not in stderr


def test_unwritable_run_folder_is_one_clear_line(tiny_coco, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    save_config(tiny_config(tiny_coco, blocker / "run"), tmp_path / "config.yaml")
    capsys.readouterr()
    assert main(["train", str(tmp_path / "config.yaml"), "--no-wandb"]) == 1
    errors = one_line_errors(capsys.readouterr().err)
    assert len(errors) == 1 and f"{blocker / 'run'}: cannot create the run folder" in errors[0]


def test_every_command_checks_overrides_the_same_way_wherever_they_stand(checkpoint, tmp_path, capsys):
    for command in (["evaluate", "--checkpoint", str(checkpoint), "data.featurs=x", "--device", "cpu"],
                    ["evaluate", "--checkpoint", str(checkpoint), "--split", "test", "data.featurs=x"],
                    ["ground", "--checkpoint", str(checkpoint), "--split", "test", "data.featurs=x"],
                    ["caption", str(tmp_path / "x.png"), "--checkpoint", str(checkpoint), "data.featurs=x"],
                    ["train", str(checkpoint.parent / "config.yaml"), "--no-wandb", "data.featurs=x"]):
        assert main(command) == 1, command
        errors = one_line_errors(capsys.readouterr().err)
        assert len(errors) == 1 and "unknown setting 'data.featurs'; did you mean 'data.features'?" in errors[0], command
    with pytest.raises(SystemExit):
        main(["compare", str(checkpoint.parent), "--out", str(tmp_path), "data.features=x"])
    assert "'compare' takes no section.key=value overrides" in capsys.readouterr().err


def test_overrides_after_options_reach_the_command(checkpoint, tmp_path, capsys):
    assert main(["evaluate", "--checkpoint", str(checkpoint), "--split", "test", "--out", str(tmp_path),
                 "--device", "cpu",
                 "decode.max_length=2", "--beam", "1"]) == 0
    captions = json.loads((tmp_path / "captions_test.json").read_text())
    assert max(len(c["caption"].split()) for c in captions) <= 2
    config = tmp_path / "run.yaml"
    save_config(complete(load_checkpoint(checkpoint)["config"]), config)
    capsys.readouterr()
    assert main(["config", str(config), "model.decoder=transformer"]) == 0   # a Transformer with its own defaults
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["decoder"] == "transformer"
    assert printed["model"]["transformer"]["dropout"] == 0.1 and printed["model"]["transformer"]["region_position"] == "learned"
    model = build_model(load_config(config, ["model.decoder=transformer"]), vocab_size=9, pretrained=False)
    assert model.decoder.config.dropout == 0.1 and model.decoder.config.region_position == "learned"


def test_a_checkpoint_of_the_flat_config_layout_loads_and_decodes_as_before(tmp_path):
    """tests/fixtures/legacy_hard_lstm.pt.gz was written by the code before decoders had config sections of
    their own (flat model.* keys, train.label_smoothing, the REINFORCE baseline as decoder buffers): a 1-epoch
    hard-attention LSTM with sinusoidal region positions, its encoder weights zeroed to keep the file small.
    legacy_hard_lstm.json holds what that code decoded for the image built below (beam 2, 8 words)."""
    fixtures = Path(__file__).parent / "fixtures"
    path = tmp_path / "legacy.pt"
    path.write_bytes(gzip.decompress((fixtures / "legacy_hard_lstm.pt.gz").read_bytes()))
    expected = json.loads((fixtures / "legacy_hard_lstm.json").read_text())
    predictor = Predictor.load(path, beam=2)
    config, payload = predictor.config, load_checkpoint(path)
    assert config.model.lstm.position_dim == 8 and config.model.lstm.attention_mode == "hard"
    assert config.loss.hard_reward == "per_word" and config.loss.label_smoothing == 0.1
    assert model_and_loss_states(payload)[1]["baseline_updates"] > 0      # the baseline moved to the loss
    image = tmp_path / "image.png"
    Image.fromarray((np.arange(32 * 32 * 3).reshape(32, 32, 3) * 7 % 256).astype(np.uint8)).save(image)
    (result,) = predictor.with_decoding(max_length=8).caption([image])
    assert result.generation.tokens == expected["tokens"]
    assert result.generation.log_prob == pytest.approx(expected["log_prob"], abs=1e-4)
    assert result.generation.attention["chosen"].argmax(-1).tolist() == expected["chosen"]
    torch.testing.assert_close(result.generation.attention["alpha"], torch.tensor(expected["alpha"]), atol=1e-5, rtol=0)
