"""The main job end to end in its fast mode (`captioner demo --fast`): every run trained, evaluated and
summarised in the shape `make demo` promises, figures and the comparison report written; a run trained on
several worker processes takes the steps of one trained in one process; a failing or stopped run stops the demo."""

import io
import json
import multiprocessing
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from conftest import count_meteor_starts

from captioner.checkpoint import load_checkpoint
from captioner.cli import main
from captioner.config import load_config, recipes
from captioner.data.shapes import generate_shapes
from captioner.errors import CaptionerError
from captioner.workflows.demo import DEMO_RUNS, FAST_OVERRIDES, LinePrefixer, default_processes, ensure_shapes, \
    reset_stale_features, shapes_overrides, train_on_workers, train_run


def test_demo_fast_writes_the_summary_figures_and_report(tmp_path, capfd, monkeypatch):
    out, data = tmp_path / "demo", tmp_path / "shapes"
    meteor_starts = count_meteor_starts(monkeypatch)
    assert main(["demo", "--fast", "--out", str(out), "--data", str(data), "--processes", "1"]) == 0
    assert len(meteor_starts) == (1 if shutil.which("java") else 0)    # one METEOR Java process scored all five runs
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["runs"]) == list(DEMO_RUNS)
    for name, run in summary["runs"].items():
        for key in ("BLEU-4", "CIDEr", "METEOR", "train_seconds", "done_after_seconds"):
            assert isinstance(run[key], float), (name, key)
        for key in ("object_precision", "relation_accuracy", "pointing_accuracy"):  # None: nothing to judge
            assert key in run and (run[key] is None or 0.0 <= run[key] <= 1.0), (name, key)
        assert Path(run["checkpoint"]).is_file()
    assert len(summary["figures"]) == 4 and all(Path(f).stat().st_size > 1000 for f in summary["figures"])
    assert (out / "report" / "report.html").stat().st_size > 10_000
    assert len(list((out / "report").glob("attention_*.png"))) == len(DEMO_RUNS)     # --fast: one image per run
    printed = capfd.readouterr().out
    assert "pointing_accuracy" in printed and "wrote" in printed
    assert f"runs still to finish: {', '.join(DEMO_RUNS[1:])}; meanwhile, try `captioner caption" in printed
    # A second run reuses the data and the feature cache; --runs trains a subset, SCST from the soft run before.
    assert main(["demo", "--fast", "--out", str(out), "--data", str(data), "--runs", "soft_scst", "--seed", "1",
                 "--processes", "1"]) == 0
    printed = capfd.readouterr().out
    assert "shapes data: reusing" in printed and "runs still to finish: soft_scst;" in printed
    rerun = json.loads((out / "summary.json").read_text())["runs"]
    assert list(rerun) == list(DEMO_RUNS) and rerun["soft"] == summary["runs"]["soft"]   # the others kept
    assert yaml.safe_load((out / "soft_scst" / "config.yaml").read_text())["run"]["seed"] == 1
    assert main(["demo", "--fast", "--out", str(tmp_path / "other"), "--data", str(data), "--runs", "soft_scst"]) == 1
    assert "starts from run 'soft'" in capfd.readouterr().err
    assert summary["figures_after_seconds"] <= summary["runs"]["none"]["done_after_seconds"]  # drawn once soft was done
    # A run trained on two worker processes takes the steps of the same run in this process (dropout off: its
    # draws differ between ranks).
    again = tmp_path / "again"
    config = {name: load_config(recipes()["demo_none"], shapes_overrides(data, out / "features") + FAST_OVERRIDES
                                + ["model.lstm.dropout=0", f"run.out={again / name}"])
              for name in ("workers", "here", "next")}
    # a run is handed back as its training ends, the next already started on the slot it freed (idle: none of 2)
    yielded = list(train_on_workers([("workers", config["workers"], 2), ("next", config["next"], 1)], again, 2))
    assert [(name, idle) for name, _, idle in yielded] == [("workers", 1), ("next", 2)]
    result = yielded[0][1]
    train_run("here", config["here"])
    on_workers, here = (load_checkpoint(again / name / "last.pt") for name in ("workers", "here"))
    assert on_workers["progress"]["step"] == here["progress"]["step"] and result["epochs"] == 1
    for name, weights in here["model"].items():
        torch.testing.assert_close(on_workers["model"][name], weights, rtol=1e-4, atol=1e-5, msg=name)
    assert not (again / "workers" / "scores_test.json").exists()    # the caller scores it
    # --resume continues a run from its last.pt: a finished one trains no further and keeps its scores (here on
    # two worker processes, after one trained it: the first run on both, data parallel, then the others side by side).
    kept = [out / name / file for name in ("none", "hard") for file in ("last.pt", "scores_test.json")]
    written = {path: path.stat().st_mtime_ns for path in kept}
    assert main(["demo", "--fast", "--out", str(out), "--data", str(data), "--runs", "none", "hard", "--resume",
                 "--processes", "2"]) == 0
    printed = capfd.readouterr().out
    assert "'none' on all of them, data parallel, then the others side by side, one process each" in printed   # soft was trained before
    assert "'none' (LSTM, attention: none), on from its last.pt" in printed
    assert "'hard' (LSTM, attention: hard), on from its last.pt" in printed
    assert "'hard': the test scores of best.pt kept from before" in printed                # nor scored again
    assert {path: path.stat().st_mtime_ns for path in kept} == written
    resumed = json.loads((out / "summary.json").read_text())["runs"]
    for name in ("none", "hard"):
        assert all(resumed[name][k] == summary["runs"][name][k] for k in ("BLEU-4", "CIDEr", "METEOR", "epochs"))


def _files(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("data", ["own captions", "shapes data of other settings"])
def test_the_demo_leaves_a_data_folder_it_did_not_make_as_it_was(tmp_path, capsys, data):
    folder = tmp_path / "data"
    if data == "own captions":
        (folder / "annotations").mkdir(parents=True)
        (folder / "annotations" / "captions_train.json").write_text('{"images": [], "annotations": []}')
    else:
        generate_shapes(folder, seed=1, num_images=8, image_size=32)    # as `captioner data shapes` makes it
    before = _files(folder)
    assert main(["demo", "--fast", "--out", str(tmp_path / "demo"), "--data", str(folder)]) == 1
    assert capsys.readouterr().err == (f"captioner: error: {folder}: holds files that are not the demo's shapes data; "
                                       f"choose an empty or new folder (--data)\n")
    assert _files(folder) == before


def test_the_demo_generates_anew_only_the_shapes_files_of_its_own_folder(tmp_path, capsys):
    folder = tmp_path / "data"
    folder.mkdir()                                                      # empty: the demo's to fill
    assert ensure_shapes(folder, num_images=12)["num_images"] == 12
    (folder / "notes.txt").write_text("mine")
    assert ensure_shapes(folder, num_images=9) == json.loads((folder / "annotations" / "captions_test.json")
                                                             .read_text())["info"]
    images = sorted(p.name for p in (folder / "images").rglob("*.png"))
    assert images == [f"{k:06d}.png" for k in range(1, 10)]             # none of the 12 left over
    assert (folder / "notes.txt").read_text() == "mine"
    capsys.readouterr()
    ensure_shapes(folder, num_images=9)
    assert "shapes data: reusing" in capsys.readouterr().out


def test_the_demo_empties_only_a_feature_cache_it_made(tmp_path):
    features = tmp_path / "features"
    reset_stale_features(features, {"seed": 0})
    (features / "features.npy").write_bytes(b"old")
    reset_stale_features(features, {"seed": 1})                         # other data: its own cache emptied
    assert sorted(p.name for p in features.iterdir()) == ["shapes_info.json"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "flickr8k").write_bytes(b"features of the user's")
    with pytest.raises(CaptionerError, match=re.escape(f"{mine}: holds files that are not the demo's feature cache; "
                                                       f"choose an empty or new folder (--out)")):
        reset_stale_features(mine, {"seed": 0})
    assert [p.name for p in mine.iterdir()] == ["flickr8k"]


def test_a_failing_run_fails_the_demo_with_its_error_and_leaves_no_worker(tmp_path):
    missing = tmp_path / "no_shapes_here"
    config = load_config(recipes()["demo_soft"], shapes_overrides(missing, tmp_path / "features")
                         + FAST_OVERRIDES + [f"run.out={tmp_path / 'soft'}"])
    with pytest.raises(CaptionerError, match="no finished feature cache"):     # the ranks' error, raised here
        list(train_on_workers([("soft", config, 2), ("none", config, 1)], tmp_path, 2))
    assert multiprocessing.active_children() == []


def test_a_training_stopped_by_a_signal_stops_the_demo(tmp_path, capsys, monkeypatch):
    trained = []

    def stopped_training(config, **kwargs):     # what train returns after Ctrl-C: last.pt saved, stopped
        trained.append(Path(config.run.out).name)
        return {"stopped": True, "checkpoint": str(Path(config.run.out) / "last.pt")}

    monkeypatch.setattr("captioner.workflows.demo.train", stopped_training)
    out = tmp_path / "demo"
    assert main(["demo", "--fast", "--processes", "1", "--out", str(out), "--data", str(tmp_path / "shapes")]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert trained == ["soft"] and not (out / "summary.json").exists()    # nothing after the stopped run


def test_line_prefixer_prefixes_whole_lines_and_leaves_blank_ones_out():
    stream = io.StringIO()
    prefixed = LinePrefixer(stream, "[soft] ")
    prefixed.write("\nepoch 1")
    assert stream.getvalue() == ""          # no line complete yet
    prefixed.write(": loss 2.1\nepoch 2: loss 1.9\n")
    prefixed.write("early stop")
    prefixed.flush()
    assert stream.getvalue() == "[soft] epoch 1: loss 2.1\n[soft] epoch 2: loss 1.9\n[soft] early stop\n"


@pytest.mark.parametrize("cores, batches, processes", [(2, (64, 32), 2), (16, (64, 32), 4), (3, (64, 32), 2),
                                                       (1, (64,), 1), (4, (6,), 3)])
def test_runs_train_on_a_process_per_core_that_splits_every_batch(monkeypatch, cores, batches, processes):
    monkeypatch.setattr("captioner.workflows.demo.usable_cores", lambda: cores)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_processes({str(b): load_config(None, [f"train.batch_size={b}"]) for b in batches}) == processes
