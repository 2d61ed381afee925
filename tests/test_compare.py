"""``captioner compare``: stored scores are used only when they are the run's checkpoint's with the report's decode
settings, runs in folders of the same name stay apart, ``--images`` is checked when the arguments are parsed, and
damaged ``metrics.jsonl`` / ``scores_*.json`` files give a warning or one line, never a traceback."""

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest

from captioner.cli import main, parse_args
from captioner.errors import CaptionerError
from captioner.evaluation import caption_metrics
from captioner.evaluation.caption_metrics import score_captions
from captioner.training.engine import train
from captioner.workflows.evaluate import evaluate_checkpoint
from captioner.workflows.report import run_names, write_report
from tests.conftest import tiny_config
from tests.test_reliability import one_line_errors

SENTINEL = 0.123456   # a CIDEr that only a reused scores file can show


@pytest.fixture(scope="module", autouse=True)
def quick_scores():
    """Evaluation without the Java tokenizer and METEOR (which take seconds to start): BLEU, ROUGE-L and CIDEr of
    the same captions, which is all these tests compare."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(caption_metrics, "score_captions",
                      lambda references, captions, spice=False: score_captions(references, captions, java=False))
        yield


@pytest.fixture(scope="module")
def trained_run(tiny_coco, tmp_path_factory):
    run = tmp_path_factory.mktemp("compare") / "run"
    train(tiny_config(tiny_coco, run, train={"epochs": 1}))
    return run


@pytest.fixture(scope="module")
def beam2_scores(trained_run, tmp_path_factory):
    """What ``captioner evaluate --beam 2`` writes for the trained run (into a folder of its own)."""
    return evaluate_checkpoint(trained_run / "best.pt", "test", beam=2, out_dir=tmp_path_factory.mktemp("eval"),
                               progress=False)


@pytest.fixture
def run(trained_run, tmp_path):
    """A byte-for-byte copy of the trained run that the test may change."""
    return Path(shutil.copytree(trained_run, tmp_path / "runs" / "run"))


def made_by(checkpoint: Path, overrides: list[str] = ()) -> dict:
    """The fields that say which checkpoint and overrides a scores file was made with."""
    return {"checkpoint_sha256": [hashlib.sha256(checkpoint.read_bytes()).hexdigest()], "overrides": list(overrides)}


def store_scores(run: Path, scores: dict) -> None:
    (run / "scores_test.json").write_text(json.dumps({**scores, "CIDEr": SENTINEL}))


def reported_cider(run: Path, out: Path) -> float:
    return write_report([run], out, beam=2, images=0)["runs"]["run"]["CIDEr"]


def test_scores_of_the_same_checkpoint_and_decode_settings_are_reused(run, beam2_scores, tmp_path):
    assert {k: beam2_scores[k] for k in ("checkpoint_sha256", "overrides")} == made_by(run / "best.pt")  # evaluate says
    store_scores(run, {**beam2_scores, **made_by(run / "best.pt")})
    assert reported_cider(run, tmp_path / "report") == SENTINEL
    html = (tmp_path / "report" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2   # --images 0: the curves and the histogram, no examples


@pytest.mark.parametrize("made", ["by an evaluate that does not say", "with beam 1", "with overrides"])
def test_scores_made_otherwise_are_computed_again(run, beam2_scores, tmp_path, made):
    unsaid = {k: v for k, v in beam2_scores.items() if k not in ("checkpoint_sha256", "overrides")}  # older versions
    stored = {"by an evaluate that does not say": unsaid,
              "with beam 1": {**beam2_scores, **made_by(run / "best.pt"), "beam": 1,
                              "decode": {**beam2_scores["decode"], "beam": 1}},
              "with overrides": {**beam2_scores, **made_by(run / "best.pt", ["decode.max_length=2"])}}[made]
    store_scores(run, stored)
    assert reported_cider(run, tmp_path / "report") == pytest.approx(beam2_scores["CIDEr"])
    assert "beam 2." in (tmp_path / "report" / "report.md").read_text()
    rewritten = json.loads((run / "scores_test.json").read_text())   # evaluated into the run folder, as documented
    assert rewritten["beam"] == 2 and rewritten["CIDEr"] == pytest.approx(beam2_scores["CIDEr"])


def test_a_retrained_run_is_evaluated_again(run, beam2_scores, tiny_coco, tmp_path):
    store_scores(run, {**beam2_scores, **made_by(run / "best.pt")})   # the first model's, as evaluate would record
    train(tiny_config(tiny_coco, run, train={"epochs": 1}, run={"seed": 1}), overwrite=True)
    cider = reported_cider(run, tmp_path / "report")
    assert cider != SENTINEL and cider == json.loads((run / "scores_test.json").read_text())["CIDEr"]


def test_run_names_are_the_shortest_distinct_path_suffixes(tmp_path):
    assert run_names([tmp_path / "a" / "run", tmp_path / "b" / "run", tmp_path / "soft"]) == ["a/run", "b/run", "soft"]
    assert run_names([tmp_path / "p" / "x" / "run", tmp_path / "q" / "x" / "run"]) == ["p/x/run", "q/x/run"]
    with pytest.raises(CaptionerError, match="given twice"):
        run_names([tmp_path / "a", tmp_path / "b" / ".." / "a"])


def test_runs_in_folders_of_the_same_name_get_their_own_rows_and_figures(trained_run, tmp_path):
    runs = [Path(shutil.copytree(trained_run, tmp_path / parent / "run")) for parent in ("a", "b")]
    result = write_report(runs, tmp_path / "report", beam=1, images=1)
    assert list(result["runs"]) == ["a/run", "b/run"]
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "| a/run |" in markdown and "| b/run |" in markdown
    figures = {line.split("](")[1].rstrip(")") for line in markdown.splitlines() if line.startswith("![a/run]")
               or line.startswith("![b/run]")}
    assert len(figures) == 2 and all((tmp_path / "report" / name).exists() for name in figures)
    assert (tmp_path / "report" / "report.html").read_text().count("data:image/png;base64,") == 2 + 2


def test_a_negative_image_count_is_refused_when_the_arguments_are_parsed(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["compare", str(tmp_path), "--out", str(tmp_path / "report"), "--images", "-1"])
    assert stopped.value.code == 2
    assert "argument --images: must be at least 0, not -1" in capsys.readouterr().err
    assert parse_args(["compare", "run", "--out", "report", "--images", "0"]).images == 0


def test_a_partial_last_metrics_line_is_skipped_and_damaged_scores_computed_again(run, tmp_path, caplog):
    metrics = run / "metrics.jsonl"
    complete_lines = metrics.read_text().count("\n")
    with metrics.open("a") as handle:
        handle.write('{"type": "train", "st')              # a run killed while writing its next record
    scores = run / "scores_test.json"
    scores.write_text('{"BLEU-1": 0.5, "BLE')
    with caplog.at_level(logging.WARNING, logger="captioner"):
        result = write_report([run], tmp_path / "report", beam=2, images=0)
    assert f"{metrics}: line {complete_lines + 1} is not JSON (" in caplog.text
    assert f"{scores}: line 1 is not JSON (" in caplog.text
    assert result["runs"]["run"]["CIDEr"] == json.loads(scores.read_text())["CIDEr"]


def test_a_bad_metrics_line_before_the_last_is_one_line_error(run, tmp_path, capsys):
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    lines[1] = lines[1][:10]
    metrics.write_text("\n".join(lines) + "\n")
    assert main(["compare", str(run), "--out", str(tmp_path / "report")]) == 1
    errors = one_line_errors(capsys.readouterr().err)
    assert len(errors) == 1 and errors[0].startswith(f"captioner: error: {metrics}: line 2 is not JSON (")
