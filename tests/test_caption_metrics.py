"""score_captions (pycocoevalcap scorers after the PTB tokenizer, Java) and COCO results files.

Java start-up (METEOR loads its paraphrase table) takes seconds, so the scores are computed once per
module by the ``scores`` fixture.
"""

import json
import logging
import os
import time
from pathlib import Path

import pytest
from conftest import count_meteor_starts

from captioner.errors import CaptionerError
from captioner.evaluation import caption_metrics
from captioner.evaluation.caption_metrics import (
    METRICS,
    ptb_tokenize,
    score_captions,
    write_coco_results,
)

REFERENCES = {
    1: ["A dog runs across the green grass.", "a brown dog running on a lawn", "The dog is playing outside."],
    2: ["Two people ride bicycles down a city street.", "cyclists on a busy road", "two riders on bikes in town"],
    3: ["A plate of pasta with tomato sauce.", "spaghetti on a white plate", "a dish of noodles and sauce"],
    4: ["A red car parked next to a building.", "a small red car by the wall", "the car is parked on the street"],
    5: ["A cat sleeping on a sofa.", "a grey cat asleep on the couch", "the kitten naps on a cushion"],
}
RIGHT = {image_id: captions[0] for image_id, captions in REFERENCES.items()}
WRONG = {1: "a bowl of soup on a table", 2: "a cat sleeping on a sofa", 3: "two people ride bicycles",
         4: "a dog on the grass", 5: "a red car next to a building"}
TAGGED = {image_id: f"<start> {caption} <end> <pad> <pad>" for image_id, caption in RIGHT.items()}


def java_children() -> list[str]:
    """Command lines of this process's child processes that run java."""
    children = []
    for stat_path in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_path.read_text().rsplit(")", 1)[1].split()
            command = (stat_path.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and "java" in command:
            children.append(command)
    return children


class ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def scores(tmp_path_factory):
    """Scores of the right, wrong and tagged candidates; SPICE is requested for the tagged ones."""
    handler = ListHandler()
    caption_metrics.log.addHandler(handler)
    no_corenlp = tmp_path_factory.mktemp("spice_without_corenlp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(caption_metrics, "_SPICE_DIR", no_corenlp)
        references_with_tags = {i: [f"<start> {c} <end>" for c in captions] for i, captions in REFERENCES.items()}
        started = count_meteor_starts(patch)
        result = {
            "right": score_captions(REFERENCES, RIGHT),
            "wrong": score_captions(REFERENCES, WRONG),
            "tagged": score_captions(references_with_tags, TAGGED, spice=True),
        }
    caption_metrics.log.removeHandler(handler)
    result["log"], result["meteor_starts"] = handler.messages, len(started)
    return result


def test_identical_candidates_score_perfectly(scores):
    right = scores["right"]
    assert set(right) == set(METRICS) and all(isinstance(value, float) for value in right.values())
    for n in range(1, 5):
        assert right[f"BLEU-{n}"] == pytest.approx(1.0, abs=1e-6)
    assert right["ROUGE-L"] == pytest.approx(1.0)
    assert right["METEOR"] > 0.9
    assert right["CIDEr"] > 2.0


def test_wrong_candidates_score_lower_on_every_metric(scores):
    for metric in METRICS:
        assert scores["wrong"][metric] < scores["right"][metric], metric


def test_special_tokens_do_not_change_the_scores(scores):
    assert {metric: scores["tagged"][metric] for metric in METRICS} == scores["right"]


def test_spice_without_corenlp_is_skipped_with_a_reason(scores):
    assert "SPICE" not in scores["tagged"]
    assert any("SPICE skipped" in message and "stanford-corenlp" in message for message in scores["log"])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_only_the_kept_meteor_process_is_left_running(scores):
    children = java_children()
    assert len(children) <= 1 and all("meteor" in command for command in children), children
    caption_metrics._KEPT_METEOR.close()
    assert java_children() == []


class FakeMeteor:
    """Stands in for the METEOR Java process: scores 0.5, or fails once ``broken``."""

    born_broken = False

    def __init__(self, java):
        self.java, self.broken, self.closed = java, FakeMeteor.born_broken, False
        self.meteor_p = self
        STARTED.append(self)

    def poll(self):
        return 0 if self.closed else None

    def compute_score(self, gts, res):
        if self.broken:
            raise BrokenPipeError(32, "Broken pipe")
        return 0.5, [0.5] * len(res)

    def stderr_tail(self):
        return "no error output"

    def close(self):
        self.closed = True


STARTED: list[FakeMeteor] = []


def test_meteor_is_kept_between_scores_replaced_when_it_fails_and_closed_when_idle(scores, monkeypatch):
    assert scores["meteor_starts"] == 1                           # the fixture's three scores: one Java process
    STARTED.clear()
    monkeypatch.setattr(caption_metrics, "_MeteorProcess", FakeMeteor)
    monkeypatch.setattr(caption_metrics, "METEOR_KEEP_ALIVE_S", 0.2)
    kept, gts, res = caption_metrics._KeptMeteor(), {1: ["a dog"]}, {1: ["a dog"]}
    assert kept.score(gts, res, "java") == kept.score(gts, res, "java") == 0.5 and len(STARTED) == 1
    STARTED[0].broken = True                                      # fails while kept: a fresh one scores
    assert kept.score(gts, res, "java") == 0.5 and len(STARTED) == 2 and STARTED[0].closed
    assert kept.score(gts, res, "other-java") == 0.5 and len(STARTED) == 3 and STARTED[1].closed
    STARTED[2].broken = True
    monkeypatch.setattr(FakeMeteor, "born_broken", True)
    with pytest.raises(CaptionerError, match="METEOR failed"):      # the fresh one fails too: one line
        kept.score(gts, res, "java")
    assert kept.process is None and len(STARTED) == 4 and all(process.closed for process in STARTED)
    monkeypatch.setattr(FakeMeteor, "born_broken", False)
    kept.score(gts, res, "java")
    deadline = time.monotonic() + 10
    while kept.process is not None and time.monotonic() < deadline:          # closed 0.2 s after its last score
        time.sleep(0.05)
    assert kept.process is None and STARTED[-1].closed
    kept.score(gts, res, "java")
    kept.forget_after_fork()                     # a forked child leaves its parent's process alone
    assert kept.process is None and not STARTED[-1].closed


def test_a_held_meteor_starts_at_once_and_stays_open_until_the_scope_closes(monkeypatch):
    STARTED.clear()
    monkeypatch.setattr(caption_metrics, "_MeteorProcess", FakeMeteor)
    monkeypatch.setattr(caption_metrics, "METEOR_KEEP_ALIVE_S", 0.1)
    kept, gts, res = caption_metrics._KeptMeteor(), {1: ["a dog"]}, {1: ["a dog"]}
    with kept.held(None):                                         # no Java: nothing to start
        assert kept.process is None
    with kept.held("java"):
        assert STARTED and kept.process is STARTED[0]             # started before the first score
        assert kept.score(gts, res, "java") == 0.5
        time.sleep(0.4)                                           # four idle times: no timer closes it meanwhile
        assert kept.process is STARTED[0] and not STARTED[0].closed
        with kept.held("java"):                                   # a scope within: the same process
            assert kept.score(gts, res, "java") == 0.5
        time.sleep(0.4)
        assert kept.process is STARTED[0] and len(STARTED) == 1
    deadline = time.monotonic() + 10
    while kept.process is not None and time.monotonic() < deadline:          # closed 0.1 s after the scope
        time.sleep(0.05)
    assert kept.process is None and STARTED[0].closed


def test_ptb_tokenizer_keeps_one_line_per_text():
    texts = ["A Dog, running!", "", "line one\nline two", "The man's hat (red)."]
    assert ptb_tokenize(texts) == ["a dog running", "", "line one line two", "the man 's hat -lrb- red -rrb-"]


def test_bad_inputs_and_missing_java(monkeypatch):
    with pytest.raises(ValueError, match="no candidate"):
        score_captions(REFERENCES, {})
    with pytest.raises(ValueError, match="image id 9"):
        score_captions(REFERENCES, {9: "a dog"})
    monkeypatch.setattr(caption_metrics.shutil, "which", lambda name: None)
    with pytest.raises(CaptionerError, match="java: not found"):
        ptb_tokenize(["a dog"])


def test_coco_results_file_round_trips(tmp_path):
    path = tmp_path / "captions.json"
    write_coco_results({12: "a café by the sea", 3: "a dog", 7: ""}, path)
    assert json.loads(path.read_text(encoding="utf-8")) == [
        {"image_id": 3, "caption": "a dog"}, {"image_id": 7, "caption": ""},
        {"image_id": 12, "caption": "a café by the sea"},
    ]
