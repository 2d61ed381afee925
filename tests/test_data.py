"""Vocabulary, config, COCO and Karpathy readers, datasets and the resumable sampler."""

import json
import re

import pytest
import torch
import yaml

from captioner.config import DataConfig, defaults, load_config, parse_override
from captioner.data.dataset import CaptionDataset, EpochSampler, collate
from captioner.data.readers import read_coco_captions, read_karpathy_splits, read_split
from captioner.data.text import tokenize
from captioner.data.tokens import SPECIALS
from captioner.data.vocabulary import Vocabulary
from captioner.errors import CaptionerError


def test_tokenize_lowercases_and_drops_punctuation_as_the_coco_evaluation_does():
    assert tokenize("A dog's ball, on the well-kept lawn!") == ["a", "dog", "'s", "ball", "on", "the", "well-kept", "lawn"]
    assert tokenize("...!?") == ["!?"]                  # PTB keeps "!?" whole, and the COCO list drops "!" and "?" only
    assert tokenize("Café — naïve_dog") == ["café", "naïve_dog"]


def test_vocabulary_min_count_specials_and_round_trip():
    vocab = Vocabulary.build(["a red circle", "a red square", "a blue circle", "zebra"], min_count=2)
    assert vocab.words[:4] == list(SPECIALS)
    assert set(vocab.words[4:]) == {"a", "red", "circle"}
    ids = vocab.encode("A red zebra circle", max_length=10)
    assert ids[0] == vocab.start_index and ids[-1] == vocab.end_index
    assert vocab.unk_index in ids
    assert vocab.decode(ids) == "a red <unk> circle"
    restored = Vocabulary.from_dict(json.loads(json.dumps(vocab.to_dict())))
    assert restored == vocab and restored.index == vocab.index


def test_vocabulary_counts_the_training_words_and_keeps_them():
    captions = ["a red circle", "a red square", "a blue circle", "zebra"]
    vocab = Vocabulary.build(captions, min_count=2)
    counted = dict(zip(vocab.words, vocab.counts))
    assert counted == {"<pad>": 0, "<start>": 0, "<end>": 4, "<unk>": 3, "a": 3, "red": 2, "circle": 2}
    assert Vocabulary.from_dict(json.loads(json.dumps(vocab.to_dict()))).counts == vocab.counts
    i = vocab.index                                                   # the last two words, a word left out as <unk>
    assert vocab.endings == sorted([(i["red"], i["circle"]), (i["red"], i["<unk>"]), (i["<unk>"], i["circle"]),
                                    (i["<start>"], i["<unk>"])])
    assert Vocabulary.from_dict(json.loads(json.dumps(vocab.to_dict()))).endings == vocab.endings
    prior = vocab.log_prior().exp()
    assert prior.sum() == pytest.approx(1.0)                          # of 14 counted, <pad> and <start> as 1 each
    assert prior[vocab.index["a"]] == pytest.approx(3 / 16) and prior[vocab.index["<end>"]] == pytest.approx(4 / 16)
    plain = Vocabulary(vocab.words)                                   # as a checkpoint of an earlier version
    assert plain == vocab and plain.counts is None and "counts" not in plain.to_dict()
    assert plain.endings is None and "endings" not in plain.to_dict()
    with pytest.raises(CaptionerError, match="without its training counts"):
        plain.log_prior()
    with pytest.raises(ValueError, match="one per word"):
        Vocabulary(vocab.words, [1, 2])


def test_vocabulary_max_length_and_max_size():
    vocab = Vocabulary.build(["a b c d e f"] * 3, min_count=1, max_size=6)
    assert len(vocab) == 6
    assert len(vocab.encode("a b c d e f", max_length=3)) == 5  # <start> + 3 words + <end>


def test_config_overrides_and_unknown_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  lstm:\n    attention_dim: 64\n")
    config = load_config(path, ["model.lstm.hidden_dim=32", "encoder.grid=[7, 7]", "run.device=cpu"])
    assert config.model.lstm.attention_dim == 64 and config.model.lstm.hidden_dim == 32
    assert config.encoder.grid == [7, 7]
    assert defaults()["model"]["lstm"]["attention_dim"] == 512  # defaults untouched
    with pytest.raises(CaptionerError, match="unknown setting 'model.lstm.atention_dim'; did you mean "
                                             "'model.lstm.attention_dim'"):
        load_config(None, ["model.lstm.atention_dim=3"])
    with pytest.raises(CaptionerError, match="unknown setting 'model.attention_dim'; did you mean 'model.lstm.attention_dim'"):
        load_config(None, ["model.attention_dim=3"])
    with pytest.raises(CaptionerError, match="'model.lstm' is a section of settings, not a value"):
        load_config(None, ["model.lstm=3"])
    with pytest.raises(CaptionerError, match="expected section.key=value"):
        parse_override("model.hidden_dim")
    path.write_text("model: [unclosed\n")
    with pytest.raises(CaptionerError, match="invalid YAML"):
        load_config(path)


@pytest.mark.parametrize("override, message", [
    ("decode.max_length=abc", "decode.max_length must be a whole number, got 'abc'"),
    ("decode.beam=", "decode.beam must be a whole number, got None"),
    ("train.epochs=1.5", "train.epochs must be a whole number, got 1.5"),
    ("train.epochs.x=3", r"train.epochs must be a whole number, got \{'x': 3\}"),
    ("train.amp=1", "train.amp must be true, false or auto, got 1"),
    ("train.amp=fast", "train.amp must be true, false or auto, got 'fast'"),
    ("train.lr=abc", "train.lr must be a number, got 'abc'"),
    ("train.wandb=[1]", r"train.wandb must be offline, online or disabled, got \[1\]"),
    ("train.wandb_project=[1]", r"train.wandb_project must be text, got \[1\]"),
    ("train.batch_size=0", "train.batch_size must be at least 1, got 0"),
    ("decode.beam_groups=0", "decode.beam_groups must be at least 1, got 0"),
    ("train.lr=-1e-4", "train.lr must be at least 0, got -0.0001"),
    ("model.lstm.hidden_dim=0", "model.lstm.hidden_dim must be at least 1, got 0"),
])
def test_a_setting_of_the_wrong_kind_or_below_its_least_value_is_named(tmp_path, override, message):
    with pytest.raises(CaptionerError, match=rf"^override '{re.escape(override)}': {message}$"):
        load_config(None, [override])
    path = tmp_path / "c.yaml"                       # a config file is checked the same way, naming the file
    path.write_text(yaml.safe_dump(parse_override(override)))
    with pytest.raises(CaptionerError, match=rf"^{re.escape(str(path))}: {message}$"):
        load_config(path)


def test_settings_of_their_own_kind_pass_and_none_is_free_where_it_is_the_default():
    config = load_config(None, ["train.lr=1", "encoder.image_size=[128, 160]", "data.vocab_max_size=100",
                                "data.vocab_max_size=null", "decode.min_length=0", "encoder.grid=7"])
    assert config.train.lr == 1 and config.encoder.image_size == [128, 160]
    assert config.data.vocab_max_size is None and config.encoder.grid == 7


def test_a_config_file_that_is_not_text_is_one_line(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00model")
    with pytest.raises(CaptionerError, match=r"binary.yaml: not a text \(UTF-8\) YAML file"):
        load_config(path)


def test_decoding_refuses_a_least_length_above_the_most():
    from captioner.decoding.search import DecodeConfig

    with pytest.raises(CaptionerError, match=r"decode.min_length \(30\) must not exceed decode.max_length \(20\)"):
        DecodeConfig(min_length=30, max_length=20).check()


def test_each_default_is_written_once_in_the_class_that_reads_it():
    from captioner.config import SECTIONS
    from captioner.core.settings import default_of, settings_of
    from captioner.models.captioner import DECODERS

    config = defaults()
    classes = {**{name: (kind, config[name]) for name, kind in SECTIONS.items()},
               **{f"model.{name}": (entry.config, config["model"][name]) for name, entry in DECODERS.items()}}
    assert set(classes) == {"run", "data", "encoder", "loss", "train", "decode", "model.lstm", "model.transformer"}
    for name, (kind, section) in classes.items():
        assert section == {key: default_of(field) for key, field in settings_of(kind).items()}, name
        assert all(field.metadata["meaning"] for field in settings_of(kind).values()), name
    transformer = load_config(None, ["model.decoder=transformer"]).model.transformer
    assert transformer.dropout == 0.1 and transformer.region_position == "learned"


def test_flat_configs_of_earlier_versions_are_translated_once(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("model:\n  decoder: transformer\n  d_model: 64\n  dropout: 0.2\n  attention_dim: 32\n"
                    "  doubly_stochastic: 0.0\ntrain:\n  label_smoothing: 0.1\n  lr: 0.01\n")
    config = load_config(path)
    assert config.model.transformer.d_model == 64 and config.model.transformer.dropout == 0.2
    assert config.model.lstm.attention_dim == 32 and config.model.lstm.dropout == 0.5
    assert config.loss.doubly_stochastic == 0.0 and config.loss.label_smoothing == 0.1
    assert not hasattr(config.train, "label_smoothing") and config.train.lr == 0.01


def write_coco(tmp_path, captions_by_image):
    images = [{"id": i, "file_name": f"{i}.png", "width": 8, "height": 8} for i in captions_by_image]
    anns, k = [], 0
    for image_id, captions in captions_by_image.items():
        for caption in captions:
            anns.append({"id": k, "image_id": image_id, "caption": caption})
            k += 1
    path = tmp_path / "captions.json"
    path.write_text(json.dumps({"images": images, "annotations": anns}))
    return path


def test_coco_reader_groups_all_captions(tmp_path):
    path = write_coco(tmp_path, {7: ["A cat.", "a  small cat"], 3: ["a dog"]})
    records = read_coco_captions(path, tmp_path / "imgs", "train")
    assert [r.image_id for r in records] == [3, 7]
    assert records[1].captions == ["A cat.", "a small cat"]
    assert records[1].path == tmp_path / "imgs" / "7.png"


def test_coco_reader_errors_name_file_and_place(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"images": [,]}')
    with pytest.raises(CaptionerError, match=r"bad.json: malformed JSON at line 1"):
        read_coco_captions(bad, tmp_path, "train")
    path = write_coco(tmp_path, {1: ["!!!"]})
    with pytest.raises(CaptionerError, match="annotation id 0: caption '!!!' has no words"):
        read_coco_captions(path, tmp_path, "train")
    path = write_coco(tmp_path, {1: ["   "]})
    with pytest.raises(CaptionerError, match="annotation id 0: caption '   ' has no words"):
        read_coco_captions(path, tmp_path, "train")
    path.write_text(json.dumps({"images": [], "annotations": [{"id": 1, "image_id": 5, "caption": "x"}]}))
    with pytest.raises(CaptionerError, match="not listed in 'images'"):
        read_coco_captions(path, tmp_path, "train")
    path.write_text(json.dumps({"annotations": []}))
    with pytest.raises(CaptionerError, match="missing key"):
        read_coco_captions(path, tmp_path, "train")


def test_karpathy_reader_restval_joins_train(tmp_path):
    data = {"images": [
        {"filepath": "val2014", "filename": "a.jpg", "cocoid": 11, "split": "restval", "sentences": [{"raw": "one"}]},
        {"filepath": "train2014", "filename": "b.jpg", "cocoid": 12, "split": "train", "sentences": [{"raw": "two"}, {"raw": "Ünïcode ok"}]},
        {"filepath": "val2014", "filename": "c.jpg", "cocoid": 13, "split": "test", "sentences": [{"raw": "three"}]},
    ]}
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(data))
    train = read_karpathy_splits(path, tmp_path, ("train",))["train"]
    assert [r.image_id for r in train] == [11, 12]
    assert train[0].path == tmp_path / "val2014" / "a.jpg"
    assert [r.image_id for r in read_karpathy_splits(path, tmp_path, ("test",))["test"]] == [13]
    assert read_karpathy_splits(path, tmp_path, ("train",), restval="val")["train"][0].image_id == 12
    config = DataConfig(format="karpathy", karpathy=str(path), image_root=str(tmp_path), restval="train")
    with pytest.raises(CaptionerError, match="no images in split 'val'"):
        read_split(config, "val")


def test_max_train_and_val_images_keep_the_first_images_of_the_file_and_leave_test_whole(tmp_path):
    images = [{"filepath": "images", "filename": f"{split}{k}.jpg", "imgid": 10 * n + k, "split": split,
               "sentences": [{"raw": f"photo {k}"}]}
              for n, split in enumerate(("val", "train", "test")) for k in (3, 1, 2)]
    (tmp_path / "dataset_flickr8k.json").write_text(json.dumps({"images": images}))
    config = DataConfig(format="karpathy", karpathy=str(tmp_path / "dataset_flickr8k.json"), image_root=str(tmp_path),
                        max_train_images=2, max_val_images=1)
    assert [r.path.name for r in read_split(config, "train")] == ["train3.jpg", "train1.jpg"]    # file order, not sorted
    assert [r.path.name for r in read_split(config, "val")] == ["val3.jpg"]
    assert len(read_split(config, "test")) == 3
    whole = DataConfig(format="karpathy", karpathy=config.karpathy, image_root=str(tmp_path))
    assert len(read_split(whole, "train")) == 3
    quick = load_config("flickr8k_soft")
    assert (quick.data.max_train_images, quick.data.max_val_images) == (700, 100)
    full = load_config("flickr8k_full_soft")
    assert quick.data.karpathy == full.data.karpathy == "data/flickr8k/dataset_flickr8k.json"
    assert (full.data.max_train_images, full.data.max_val_images) == (None, None)


@pytest.mark.parametrize("name,command", [
    ("flickr8k/dataset_flickr8k.json", "captioner data flickr8k --root {root}/flickr8k"),
    ("coco/dataset_coco.json", "captioner data coco --root {root}/coco")])
def test_a_missing_split_file_names_the_command_that_makes_it(tmp_path, name, command):
    config = DataConfig(format="karpathy", karpathy=str(tmp_path / name), image_root=str(tmp_path / name.split("/")[0]))
    expected = (f"{tmp_path / name}: not found; make it with: {command.format(root=tmp_path)} "
                "(or set data.karpathy and data.image_root)")
    with pytest.raises(CaptionerError) as error:
        read_split(config, "train")
    assert str(error.value) == expected
    other = DataConfig(format="karpathy", karpathy=str(tmp_path / "mine.json"), image_root=str(tmp_path))
    with pytest.raises(CaptionerError, match=r"mine.json: not found; set data.karpathy and data.image_root$"):
        read_split(other, "train")


class FakeCache:
    def __init__(self, ids):
        self.ids, self.folder = set(ids), "cache"

    def __contains__(self, image_id):
        return image_id in self.ids

    def __getitem__(self, image_id):
        return torch.full((4, 3), float(image_id))


def test_dataset_pairs_and_padding_collate(tmp_path):
    path = write_coco(tmp_path, {1: ["a b", "a b c d"], 2: ["c"], 3: ["d"]})
    records = read_coco_captions(path, tmp_path, "train")
    vocab = Vocabulary.build(["a b c d"], min_count=1)
    pairs = CaptionDataset(records, vocab, 20, features=FakeCache([1, 2]), pairs=True)
    assert pairs.missing == [3] and len(pairs) == 3
    batch = collate([pairs[i] for i in range(len(pairs))])
    assert batch["features"].shape == (3, 4, 3) and "images" not in batch and batch["size"] == 3
    assert batch["lengths"].tolist() == [4, 6, 3]
    assert batch["captions"][2, 3:].eq(vocab.pad_index).all()
    images = CaptionDataset(records, vocab, 20, features=FakeCache([1, 2]), pairs=False)
    assert len(images) == 2 and images[0]["caption"] is None


def test_epoch_sampler_is_deterministic_resumable_and_sharded():
    sampler = EpochSampler(10, seed=3)
    sampler.set_epoch(2)
    full = list(sampler)
    assert sorted(full) == list(range(10))
    sampler.set_epoch(2, start=4)
    assert list(sampler) == full[4:]
    sampler.set_epoch(3)
    assert list(sampler) != full
    shards = []
    for rank in range(3):
        s = EpochSampler(10, seed=3, rank=rank, world_size=3)
        s.set_epoch(2)
        shards.append(list(s))
    assert all(len(s) == 4 for s in shards)
    assert set(sum(shards, [])) == set(range(10))


def test_epoch_sampler_mirrors_items_by_chance_in_the_same_order_and_resumes():
    plain = EpochSampler(200, seed=3)
    plain.set_epoch(2)
    sampler = EpochSampler(200, seed=3, mirror=0.5)
    sampler.set_epoch(2)
    drawn = list(sampler)
    assert [i % 200 for i in drawn] == list(plain)            # the order of an unmirrored run, some items mirrored
    assert all(0 <= i < 400 for i in drawn) and 60 < sum(i >= 200 for i in drawn) < 140
    sampler.set_epoch(2, start=7)
    assert list(sampler) == drawn[7:]
    sampler.set_epoch(3)
    assert [i >= 200 for i in sampler] != [i >= 200 for i in drawn]   # each epoch its own draws
    every = EpochSampler(200, seed=3, mirror=1.0)
    every.set_epoch(2)
    assert all(i >= 200 for i in every)
    shards = []
    for rank in range(2):
        s = EpochSampler(200, seed=3, rank=rank, world_size=2, mirror=0.5)
        s.set_epoch(2)
        shards.append(list(s))
    assert shards[0] + shards[1] != drawn and sorted(shards[0] + shards[1]) == sorted(drawn)


def test_saved_configs_gain_settings_added_since(tmp_path):
    from captioner.config import complete

    old = {"model": {"hidden_dim": 7}, "train": {"lr": 0.5}}
    merged = complete(old)
    assert merged.model.lstm.hidden_dim == 7 and merged.train.lr == 0.5
    assert merged.model.lstm.attention == defaults()["model"]["lstm"]["attention"]   # filled in
    assert old == {"model": {"hidden_dim": 7}, "train": {"lr": 0.5}}        # not modified