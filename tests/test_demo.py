"""The main job end to end in its fast mode (`captioner demo --fast`): every run trained, evaluated and
summarised in the shape `make demo` promises, figures and the comparison report written; runs trained side by
side in worker processes equal runs trained one after the other; a failing or stopped run stops the demo."""

import io
import json
import multiprocessing
from pathlib import Path

import pytest
import torch
import yaml

from captioner.checkpoint import load_checkpoint
from captioner.cli import main
from captioner.config import load_config
from captioner.demo import CONFIG_DIR, DEMO_RUNS, FAST_OVERRIDES, LinePrefixer, default_jobs, shapes_overrides, \
    threads_per_job, train_and_score, train_side_by_side
from captioner.errors import CaptionerError


def test_demo_fast_writes_the_summary_figures_and_report(tmp_path, capsys):
    out, data = tmp_path / "demo", tmp_path / "shapes"
    assert main(["demo", "--fast", "--out", str(out), "--data", str(data)]) == 0
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
    printed = capsys.readouterr().out
    assert "pointing_accuracy" in printed and "wrote" in printed
    # A second run reuses the data and the feature cache; --runs trains a subset, SCST from the soft run before.
    assert main(["demo", "--fast", "--out", str(out), "--data", str(data), "--runs", "soft_scst", "--seed", "1"]) == 0
    assert "shapes data: reusing" in capsys.readouterr().out
    rerun = json.loads((out / "summary.json").read_text())["runs"]
    assert list(rerun) == list(DEMO_RUNS) and rerun["soft"] == summary["runs"]["soft"]   # the others kept
    assert yaml.safe_load((out / "soft_scst" / "config.yaml").read_text())["run"]["seed"] == 1
    assert main(["demo", "--fast", "--out", str(tmp_path / "other"), "--data", str(data), "--runs", "soft_scst"]) == 1
    assert "starts from run 'soft'" in capsys.readouterr().err
    # The same run in this process, with the threads a worker had: the same weights, the same scores.
    side_by_side = load_checkpoint(out / "none" / "best.pt")["model"]
    again = tmp_path / "again"
    config = load_config(CONFIG_DIR / "demo_none.yaml", shapes_overrides(data, out / "features") + FAST_OVERRIDES
                         + [f"run.out={again / 'none'}"])
    threads = torch.get_num_threads()
    torch.set_num_threads(threads_per_job(default_jobs(len(DEMO_RUNS))))
    try:
        row = train_and_score("none", config, again)
    finally:
        torch.set_num_threads(threads)
    in_process = load_checkpoint(again / "none" / "best.pt")["model"]
    assert side_by_side.keys() == in_process.keys()
    assert all(torch.equal(side_by_side[k], in_process[k]) for k in side_by_side)
    assert all(row[k] == summary["runs"]["none"][k] for k in ("BLEU-4", "CIDEr", "METEOR", "object_precision"))
    # --resume continues a run from its last.pt: a finished one trains no further and keeps its scores.
    last = (out / "none" / "last.pt").stat().st_mtime_ns
    assert main(["demo", "--fast", "--out", str(out), "--data", str(data), "--runs", "none", "--resume"]) == 0
    assert "'none' (LSTM, none soft attention), on from its last.pt" in capsys.readouterr().out
    assert (out / "none" / "last.pt").stat().st_mtime_ns == last
    resumed = json.loads((out / "summary.json").read_text())["runs"]["none"]
    assert all(resumed[k] == summary["runs"]["none"][k] for k in ("BLEU-4", "CIDEr", "METEOR", "epochs"))


def test_a_failing_run_fails_the_demo_with_its_error_and_leaves_no_worker(tmp_path):
    missing = tmp_path / "no_shapes_here"
    configs = {name: load_config(CONFIG_DIR / f"demo_{name}.yaml", shapes_overrides(missing, tmp_path / "features")
                                 + FAST_OVERRIDES + [f"run.out={tmp_path / name}"]) for name in ("soft", "none")}
    with pytest.raises(CaptionerError, match="no_shapes_here"):
        train_side_by_side(configs, tmp_path, jobs=2, started=0.0)
    assert multiprocessing.active_children() == []


def test_a_training_stopped_by_a_signal_stops_the_demo(tmp_path, capsys, monkeypatch):
    trained = []

    def stopped_training(config, **kwargs):     # what train returns after Ctrl-C: last.pt saved, stopped
        trained.append(Path(config["run"]["out"]).name)
        return {"stopped": True, "checkpoint": str(Path(config["run"]["out"]) / "last.pt")}

    monkeypatch.setattr("captioner.demo.train", stopped_training)
    out = tmp_path / "demo"
    assert main(["demo", "--fast", "--jobs", "1", "--out", str(out), "--data", str(tmp_path / "shapes")]) == 130
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
