"""The Python PTB tokenizer (:func:`captioner.data.text.tokenize`) against ``pycocoevalcap``'s Java one, and
caption scores without Java.

The Java comparisons skip where ``java`` is not on PATH; those on the Flickr8k-800 and coco-mini captions skip
where ``../shared/data`` is absent.
"""

import json
import logging
import shutil
from pathlib import Path

import pytest

from captioner.data.shapes import sample_scene
from captioner.data.text import tokenize
from captioner.evaluation import caption_metrics
from captioner.evaluation.caption_metrics import ptb_tokenize, score_captions

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
FLICKR = SHARED_DATA / "flickr8k-800" / "dataset_flickr8k.json"
COCO_MINI = SHARED_DATA / "coco-mini" / "annotations" / "captions_train2017.json"

TRICKY = [
    "A dog's ball.", "The dogs' toys.", "He can't swim; she won't.", "They're here, aren't they?", "I'd say it's fine",
    "A man wearing a T-shirt and a baseball-cap.", 'A "happy" child.', "a 'quoted' word", "Rock & roll music",
    "AT&T store", "at&t store", "B&W photo", "3.5 inches", "1,000 people", "$5 bill", "50% off", "a 2-year-old",
    "Two (2) dogs", "a [big] dog", "a {curly} brace", "a (red) car)", "Wait...", "wait . . . what", "a dog... ran",
    "Hmm…", "tea..", "Mr. Smith", "Dr. Who's car", "St. Louis", "U.S.A. flag", "the U.S. flag.", "a b.", "letter A.",
    "no. 5", "a dog, no.", "Wash. state", "wash.", "etc.", "A cat -- sleeping", "A cat - sleeping", "a cat—sleeping",
    "a cat – sleeping", "x- y", "-x", "-5", "x---y", "and/or", "a 1/2 cup", "5*3", "a+b", "a=b", "~a", "a|b", "cannot",
    "gonna go", "wanna play", "gimme that", "'tis nice", "'twas night", "slip n 'slide", "rock 'n' roll",
    "rock 'n roll", "o'clock", "O'Neil's shop", "DON'T", "I'm", "you'll", "we've", "'em", "the '90s", "'cause",
    "'bout", "can 't", "``hello''", "`tick`", "‘quoted’", "“quoted”", "don’t", "cafe’s", "«x»", "a café", "colour",
    "what?!", "Hi!!", "a <b> tag", "x <y", "3:30 pm", "a:b", "a,b", "@home", "foo@bar.com.", "#hashtag", "a #1 fan",
    "&amp;", "a &lt; b", "½ cup", "£5", "€5", "¢5", "dog.)", '"Mr."', "Mr.)", "AT&T's", "AT&T.", "",
    "line one\nline two", "A  double  space",
]
"""Captions on which the two tokenizers agree, chosen for the rules of :mod:`captioner.data.text`."""

KNOWN_DIFFERENCES = {
    "y'all": ("y' all", "y'all"), "ol' man": ("ol' man", "ol man"), "d'ye know": ("d'ye know", "d 'ye know"),
    "x'y": ("x y", "x'y"), "5'10": ("5 '10", "5'10"), "¥5": ("¥ 5", "¥5"), "No.5": ("no. 5", "no.5"),
}
"""Text -> (Java's tokens, ours): the differences the module docstring of :mod:`captioner.data.text` lists."""

REFERENCES = {
    1: ["A dog's ball is on the green grass.", "a brown dog (a puppy) running on a lawn", "The dog plays outside..."],
    2: ["Two people ride bicycles down a city street.", "cyclists on a busy road; it's rush hour", "two riders"],
    3: ["A plate of pasta with tomato sauce.", "spaghetti on a white plate", "a dish of noodles & sauce"],
    4: ["A red car parked next to a building.", "a small red car by the wall", "the car isn't moving"],
}
CANDIDATES = {1: "a dog 's ball on the grass .", 2: "two people riding bikes on a street", 3: "a plate of pasta.",
              4: "a red car parked by a building"}


def words(text: str) -> str:
    return " ".join(tokenize(text))


def shapes_captions(images: int = 400) -> list[str]:
    return [caption for image_id in range(images) for caption in sample_scene(0, image_id, 128)[1]]


def karpathy_captions(path: Path) -> list[str]:
    return [sentence["raw"] for image in json.loads(path.read_text())["images"] for sentence in image["sentences"]]


def coco_captions(path: Path) -> list[str]:
    return [annotation["caption"] for annotation in json.loads(path.read_text())["annotations"]]


needs_java = pytest.mark.skipif(shutil.which("java") is None, reason="java is not on PATH")


@needs_java
def test_tricky_captions_tokenize_as_java_does():
    assert [words(text) for text in TRICKY] == ptb_tokenize(TRICKY)


@needs_java
def test_known_differences_are_as_documented():
    texts = list(KNOWN_DIFFERENCES)
    assert ptb_tokenize(texts) == [java for java, _ in KNOWN_DIFFERENCES.values()]
    assert [words(text) for text in texts] == [ours for _, ours in KNOWN_DIFFERENCES.values()]


def test_tokens_without_java():
    assert tokenize("A dog's ball (red).") == ["a", "dog", "'s", "ball", "-lrb-", "red", "-rrb-"]
    assert tokenize("Mr. Smith can't see the U.S. flag... what?!") == [
        "mr.", "smith", "ca", "n't", "see", "the", "u.s.", "flag", "what", "?!"]
    assert tokenize("slip n 'slide, rock 'n' roll & AT&T") == ["slip", "n", "slide", "rock", "'n'", "roll", "&", "at&t"]


def test_shapes_captions_are_their_words():
    """The shapes captions are lower-case words and spaces, so the tokenizer (and the vocabulary and the demo's
    numbers) are the same as with the plain word splitter used before."""
    captions = shapes_captions()
    assert [tokenize(caption) for caption in captions] == [caption.split() for caption in captions]


@needs_java
def test_shapes_captions_tokenize_as_java_does():
    captions = shapes_captions()
    assert [words(caption) for caption in captions] == ptb_tokenize(captions)


@needs_java
@pytest.mark.parametrize(("path", "read"), [(FLICKR, karpathy_captions), (COCO_MINI, coco_captions)],
                         ids=["flickr8k-800", "coco-mini"])
def test_real_captions_tokenize_as_java_does(path, read):
    """All 4,000 Flickr8k-800 and all 400 coco-mini captions give the Java tokens."""
    if not path.exists():
        pytest.skip(f"{path} is absent")
    captions = read(path)
    mismatches = [(text, java, words(text)) for text, java in zip(captions, ptb_tokenize(captions))
                  if words(text) != java]
    assert mismatches == []


@needs_java
def test_scores_without_java_equal_the_java_scores_but_meteor(monkeypatch, caplog):
    with_java = score_captions(REFERENCES, CANDIDATES)
    monkeypatch.setattr(caption_metrics.shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger=caption_metrics.log.name):
        without_java = score_captions(REFERENCES, CANDIDATES, spice=True)
    assert "METEOR" in with_java and "METEOR" not in without_java and "SPICE" not in without_java
    assert without_java == {metric: value for metric, value in with_java.items() if metric != "METEOR"}
    assert [record.getMessage().split(":")[0] for record in caplog.records] == ["METEOR and SPICE skipped"]
    assert "java is not on PATH" in caplog.records[0].getMessage()


def test_quick_training_score_logs_nothing(monkeypatch, caplog):
    monkeypatch.setattr(caption_metrics.shutil, "which", lambda name: None)
    with caplog.at_level(logging.WARNING, logger=caption_metrics.log.name):
        quick = score_captions(REFERENCES, CANDIDATES, java=False)
        missing = score_captions(REFERENCES, CANDIDATES)
    assert quick == missing and set(quick) == {"BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4", "ROUGE-L", "CIDEr"}
    assert [record.getMessage().split(":")[0] for record in caplog.records] == ["METEOR skipped"]
