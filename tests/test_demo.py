"""The main job end to end in its fast mode (`captioner demo --fast`): every run trained, evaluated and
summarised in the shape `make demo` promises, figures and the comparison report written."""

import json
from pathlib import Path

import yaml

from captioner.cli import main
from captioner.demo import DEMO_RUNS


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
