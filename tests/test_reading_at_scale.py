"""What keeps reading a COCO-sized dataset linear and small (``benchmarks/bench_coco_scale.py`` measures it): a
Karpathy file parsed once for every split a command reads, its errors still named per split; an instances
file parsed once for grounding; the vocabulary report tokenising each caption once; the dataset's items and
captions in flat arrays."""

import dataclasses
import json

import numpy as np
import pytest

from captioner.config import DataConfig
from captioner.data import readers
from captioner.data.dataset import CaptionDataset
from captioner.data.readers import read_karpathy_splits, read_split, read_splits
from captioner.data.vocabulary import (Vocabulary, save_vocabulary, training_vocabulary, vocabulary_report,
                                      with_training_counts)
from captioner.errors import CaptionerError
from captioner.evaluation import grounding


def karpathy(tmp_path, images):
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return DataConfig(format="karpathy", karpathy=str(path), image_root=str(tmp_path), restval="train",
                      vocab_min_count=1, vocab_max_size=None, max_caption_length=20)


def entry(image_id, split, *sentences):
    return {"filepath": "val2014", "filename": f"{image_id}.jpg", "cocoid": image_id, "split": split,
            "sentences": [s if not isinstance(s, str) else {"tokens": s.lower().split(), "raw": s} for s in sentences]}


def test_several_splits_parse_the_karpathy_file_once_and_match_one_split_at_a_time(tmp_path, monkeypatch):
    config = karpathy(tmp_path, [entry(1, "train", "A dog.", "Two  dogs"), entry(2, "restval", "a cat"),
                                 entry(3, "val", "a bus"), entry(4, "test", "a car", "the car")])
    parsed = []
    original = readers.read_json
    monkeypatch.setattr(readers, "read_json", lambda *a, **k: parsed.append(a[0]) or original(*a, **k))
    both = read_splits(config, ("train", "val", "test"))
    assert len(parsed) == 1
    for split, records in both.items():
        assert [(r.image_id, r.path, r.captions, r.split) for r in records] == \
            [(r.image_id, r.path, r.captions, r.split) for r in read_split(config, split)]
    assert [r.captions for r in both["train"]] == [["A dog.", "Two dogs"], ["a cat"]]


@pytest.mark.parametrize("sentence, message", [
    ("a bare string", r"images\[1\]\.sentences\[0\]: expected an object, got str"),
    ({"tokens": ["a"]}, r"images\[1\]\.sentences\[0\]: missing key\(s\) 'raw'"),
    ({"raw": 7}, r"images\[1\]\.sentences\[0\]: caption must be a string, got int"),
    ({"raw": "..."}, r"images\[1\]\.sentences\[0\]: caption '\.\.\.' has no words"),
])
def test_a_bad_sentence_is_named_when_its_split_is_read_and_only_then(tmp_path, sentence, message):
    bad = {**entry(2, "test"), "sentences": [sentence]}
    config = karpathy(tmp_path, [entry(1, "train", "a dog"), bad])
    assert [r.image_id for r in read_split(config, "train")] == [1]
    with pytest.raises(CaptionerError, match=message):
        read_karpathy_splits(config.karpathy, tmp_path, ("test",))["test"]


def test_the_vocabulary_report_counts_as_the_vocabulary_builds(tmp_path):
    config = karpathy(tmp_path, [entry(1, "train", "A red dog", "a dog, red!"), entry(2, "train", "the cat sat"),
                                 entry(3, "val", "unseen words")])
    report = vocabulary_report(dataclasses.replace(config, vocab_min_count=2), tmp_path / "vocab.json")
    built = Vocabulary.build(["A red dog", "a dog, red!", "the cat sat"], min_count=2)
    written = json.loads((tmp_path / "vocab.json").read_text())
    assert (written["words"], written["counts"]) == (built.words, built.counts)
    assert written["endings"] == [list(pair) for pair in built.endings]
    assert (report["train_captions"], report["distinct_train_words"], report["caption_length_p50_p95_max"]) == (3, 6, [3, 3, 3])
    save_vocabulary(Vocabulary(built.words), tmp_path / "plain.json")        # a file written without them
    plain = dataclasses.replace(config, vocab=str(tmp_path / "plain.json"))
    counted = training_vocabulary(plain, read_split(plain, "train"))
    assert (counted.words, counted.counts, counted.endings) == (built.words, built.counts, built.endings)
    gone = dataclasses.replace(config, karpathy=str(tmp_path / "gone.json"))
    assert with_training_counts(counted, gone) is counted          # complete: returned as it is, no caption read
    with pytest.raises(CaptionerError, match="gone.json"):
        with_training_counts(Vocabulary(built.words), gone)


def test_grounding_parses_the_instances_file_once(tmp_path, monkeypatch):
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({
        "images": [{"id": 5, "file_name": "5.jpg", "width": 32, "height": 24}],
        "annotations": [{"id": 1, "image_id": 5, "category_id": 18, "bbox": [2, 2, 12, 12], "area": 144, "iscrowd": 0,
                         "segmentation": [[2, 2, 14, 2, 14, 14, 2, 14]]}],
        "categories": [{"id": 18, "name": "dog", "supercategory": "animal"}]}))
    parsed = []
    original = grounding.read_json
    monkeypatch.setattr(grounding, "read_json", lambda *a, **k: parsed.append(a[0]) or original(*a, **k))
    targets, sizes = grounding.load_instances(path)
    assert len(parsed) == 1 and sizes == {5: (32, 24)}
    assert isinstance(targets, grounding.CocoTargets) and 5 in targets
    assert targets.target(5, "dog").box == [2.0, 2.0, 12.0, 12.0] and targets.target(5, "dog").mask.sum() > 0


def test_dataset_items_are_flat_arrays_in_record_and_caption_order(tmp_path):
    config = karpathy(tmp_path, [entry(1, "train", "a b", "a b c d"), entry(2, "train", "c"), entry(3, "train", "d e")])
    records = read_split(config, "train")
    vocab = Vocabulary.build(["a b c d e"], min_count=1)
    pairs = CaptionDataset(records, vocab, 3, transform=lambda image: image, pairs=True)
    assert isinstance(pairs.tokens, np.ndarray) and isinstance(pairs.item_record, np.ndarray)
    assert len(pairs) == 4 and [pairs.caption_length(i) for i in range(4)] == [4, 5, 3, 4]   # cut at 3 words
    expected = [(0, 1, "a b"), (0, 1, "a b c"), (1, 2, "c"), (2, 3, "d e")]
    for i, (record, image_id, words) in enumerate(expected):
        item = pairs.item_caption[i], pairs.item_record[i]
        assert int(item[1]) == record
        caption = vocab.encode(words, 3)
        assert (pairs.tokens[pairs.offsets[item[0]]:pairs.offsets[item[0] + 1]].tolist(), int(pairs.image_ids[record])) \
            == (caption, image_id)
    images = CaptionDataset(records, vocab, 3, transform=lambda image: image, pairs=False)
    assert len(images) == 3 and [images.caption_length(i) for i in range(3)] == [0, 0, 0]
