"""The synthetic shapes dataset (files, determinism, captions) and its two measures (object precision,
relation accuracy) on generated and hand-made captions."""

import itertools
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools.coco import COCO

from captioner.cli import main
from captioner.core.files import read_json
from captioner.data.shapes import (
    COLOUR_JITTER,
    COLOUR_RGB,
    COLOURS,
    EXTENT_RANGE,
    RELATIONS,
    SHAPES,
    SIZES,
    bbox_centre,
    generate_shapes,
    is_unambiguous,
    relation_of,
    sample_scene,
)
from captioner.errors import CaptionerError
from captioner.evaluation.shapes_metrics import (
    Mention,
    Relation,
    parse_caption,
    shapes_objects,
    shapes_scores,
)


def load_shapes_objects(instances_file):
    """The shapes objects of an ``instances_*.json`` file, as evaluation reads them."""
    return shapes_objects(read_json(instances_file), instances_file)


NUM_IMAGES = 60
SPLITS = ("train", "val", "test")

_MENTION = rf"(?:a|an|the)(?: (?:{'|'.join(SIZES)}))? (?:{'|'.join(COLOURS)}) (?:{'|'.join(SHAPES)})"
_CLAUSE = rf"{_MENTION}(?: (?:{'|'.join(RELATIONS)}) {_MENTION})?"
CAPTION_GRAMMAR = re.compile(rf"(?:there is )?{_CLAUSE}(?: and {_CLAUSE})*")


@pytest.fixture(scope="module")
def shapes_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes")
    summary = generate_shapes(out, seed=0, num_images=NUM_IMAGES)
    return out, summary


def _load(out, kind, split):
    return json.loads((out / "annotations" / f"{kind}_{split}.json").read_text())


def _captions_by_image(out):
    captions = defaultdict(list)
    for split in SPLITS:
        for ann in _load(out, "captions", split)["annotations"]:
            captions[ann["image_id"]].append(ann["caption"])
    return captions


def _objects(out):
    objects = {}
    for split in SPLITS:
        objects.update(load_shapes_objects(out / "annotations" / f"instances_{split}.json"))
    return objects


def _file_bytes(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ the files


def test_same_seed_gives_identical_files_whatever_the_threads_and_another_seed_differs(shapes_dir, tmp_path):
    out, _ = shapes_dir
    generate_shapes(tmp_path / "again", seed=0, num_images=NUM_IMAGES, workers=1)
    generate_shapes(tmp_path / "other", seed=1, num_images=NUM_IMAGES)
    first, again, other = _file_bytes(out), _file_bytes(tmp_path / "again"), _file_bytes(tmp_path / "other")
    assert first == again
    assert first.keys() == other.keys()
    for name in first:
        assert first[name] != other[name], name


def test_summary_and_split_layout(shapes_dir):
    out, summary = shapes_dir
    assert {s: summary["splits"][s]["images"] for s in SPLITS} == {"train": 48, "val": 6, "test": 6}
    assert sum(summary["objects_per_image"].values()) == NUM_IMAGES
    assert set(summary["objects_per_image"]) == {1, 2, 3}
    ids = [image["id"] for split in SPLITS for image in _load(out, "captions", split)["images"]]
    assert sorted(ids) == list(range(1, NUM_IMAGES + 1))
    for split in SPLITS:
        captions, instances = _load(out, "captions", split), _load(out, "instances", split)
        assert captions["images"] == instances["images"]
        assert captions["info"]["seed"] == 0 and captions["licenses"] == []
        for image in captions["images"]:
            assert image["file_name"] == f"{split}/{image['id']:06d}.png"
            with Image.open(out / "images" / image["file_name"]) as picture:
                assert picture.format == "PNG" and picture.mode == "RGB" and picture.size == (128, 128)


def test_pycocotools_loads_both_files(shapes_dir):
    out, _ = shapes_dir
    for split in SPLITS:
        captions = COCO(str(out / "annotations" / f"captions_{split}.json"))
        instances = COCO(str(out / "annotations" / f"instances_{split}.json"))
        assert sorted(captions.getImgIds()) == sorted(instances.getImgIds())
        assert all(len(captions.getAnnIds(imgIds=[i])) == 5 for i in captions.getImgIds())
        assert [c["name"] for c in instances.loadCats(instances.getCatIds())] == list(SHAPES)
        assert all(1 <= len(instances.getAnnIds(imgIds=[i])) <= 3 for i in instances.getImgIds())


def test_objects_lie_inside_apart_distinct_and_sized(shapes_dir):
    out, _ = shapes_dir
    for split in SPLITS:
        instances = _load(out, "instances", split)
        by_image = defaultdict(list)
        for ann in instances["annotations"]:
            x, y, w, h = ann["bbox"]
            assert 0 <= x and 0 <= y and x + w <= 128 and y + h <= 128
            low, high = EXTENT_RANGE[ann["size"]]
            assert low <= w <= high and w == h
            assert ann["colour"] in COLOURS and ann["iscrowd"] == 0 and 0 < ann["area"] <= w * h
            by_image[ann["image_id"]].append(ann)
        for anns in by_image.values():
            assert len({(a["category_id"], a["colour"]) for a in anns}) == len(anns)
            for a, b in itertools.combinations(anns, 2):
                (ax, ay, aw, ah), (bx, by, bw, bh) = a["bbox"], b["bbox"]
                assert ax + aw < bx or bx + bw < ax or ay + ah < by or by + bh < ay


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # pycocotools under numpy 2
def test_segmentation_traces_the_drawn_shape_in_its_colour(shapes_dir):
    out, _ = shapes_dir
    palette = np.array([COLOUR_RGB[c] for c in COLOURS], dtype=int)
    coco = COCO(str(out / "annotations" / "instances_train.json"))
    for ann in coco.loadAnns(coco.getAnnIds())[:40]:
        image = coco.loadImgs(ann["image_id"])[0]
        pixels = np.asarray(Image.open(out / "images" / image["file_name"]), dtype=int)
        mask = coco.annToMask(ann).astype(bool)
        inner = mask & np.roll(mask, 1, 0) & np.roll(mask, -1, 0) & np.roll(mask, 1, 1) & np.roll(mask, -1, 1)
        assert abs(mask.sum() - ann["area"]) <= 0.25 * ann["area"]
        inside = pixels[inner]
        nearest = np.abs(inside[:, None, :] - palette[None]).sum(-1).argmin(1)
        assert (nearest == COLOURS.index(ann["colour"])).all()
        assert (np.abs(inside - COLOUR_RGB[ann["colour"]]) <= COLOUR_JITTER).all()


def test_other_image_sizes_scale_the_objects(tmp_path):
    generate_shapes(tmp_path, num_images=12, image_size=64)
    instances = _load(tmp_path, "instances", "train")
    assert all(image["width"] == image["height"] == 64 for image in instances["images"])
    for ann in instances["annotations"]:
        x, y, w, h = ann["bbox"]
        low, high = EXTENT_RANGE[ann["size"]]
        assert 0 <= x and 0 <= y and x + w <= 64 and y + h <= 64 and low / 2 <= w <= high / 2


@pytest.mark.parametrize("arguments, message", [
    ({"num_images": 0}, "number of images"), ({"image_size": 16}, "image size"),
    ({"split_fractions": (0.8, 0.1, 0.2)}, "split fractions"), ({"split_fractions": (0.9, 0.1, 0.0)}, "positive"),
    ({"seed": -1}, "seed"), ({"workers": 0}, "workers")])
def test_bad_arguments_are_user_errors(tmp_path, arguments, message):
    with pytest.raises(CaptionerError, match=message):
        generate_shapes(tmp_path, **arguments)


def test_unwritable_output_is_a_user_error(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(CaptionerError, match="cannot write"):
        generate_shapes(tmp_path / "file", num_images=8)


@pytest.mark.parametrize("images, fractions, empty, least", [
    (3, (0.8, 0.1, 0.1), "the val split", 8), (7, (0.8, 0.1, 0.1), "the test split", 8),
    (1, (0.8, 0.1, 0.1), "the val and test splits", 8), (2, (0.25, 0.5, 0.25), "the train split", 4)])
def test_too_few_images_for_every_split_is_a_user_error_before_anything_is_written(tmp_path, images, fractions, empty,
                                                                                  least):
    with pytest.raises(CaptionerError, match=rf"^shapes data: {images} image\(s\) leave {empty} without images; "
                                             rf"the split fractions .* need at least {least} images$"):
        generate_shapes(tmp_path / "few", num_images=images, split_fractions=fractions)
    assert not (tmp_path / "few").exists()
    summary = generate_shapes(tmp_path / "enough", num_images=least, split_fractions=fractions, image_size=32)
    assert all(split["images"] > 0 for split in summary["splits"].values())


def test_cli_refuses_too_few_images_in_one_line(tmp_path, capsys):
    assert main(["data", "shapes", "--out", str(tmp_path / "few"), "--images", "3"]) == 1
    assert capsys.readouterr().err == ("captioner: error: shapes data: 3 image(s) leave the val split without images; "
                                       "the split fractions (0.8, 0.1, 0.1) need at least 8 images\n")


@pytest.mark.parametrize("own_file", ["annotations/captions_train.json", "images/train/000001.png", "notes.txt"])
def test_a_folder_holding_other_files_is_refused_and_left_as_it_was(tmp_path, capsys, own_file):
    folder = tmp_path / "mine"
    (folder / own_file).parent.mkdir(parents=True)
    (folder / own_file).write_text('{"info": {"description": "my captions"}, "images": [], "annotations": []}')
    paths, files = sorted(folder.rglob("*")), _file_bytes(folder)
    assert main(["data", "shapes", "--out", str(folder), "--images", "8"]) == 1
    assert capsys.readouterr().err == (f"captioner: error: {folder}: holds files that are not shapes data; "
                                       f"choose an empty or new folder (--out)\n")
    assert sorted(folder.rglob("*")) == paths and _file_bytes(folder) == files      # not even a folder made


def test_a_shapes_dataset_alongside_other_files_is_refused(tmp_path):
    generate_shapes(tmp_path / "data", seed=1, num_images=8, image_size=32)
    (tmp_path / "data" / "notes.txt").write_text("mine")
    before = _file_bytes(tmp_path / "data")
    with pytest.raises(CaptionerError, match="holds files that are not shapes data"):
        generate_shapes(tmp_path / "data", seed=0, num_images=9, image_size=32)
    assert _file_bytes(tmp_path / "data") == before


def test_an_earlier_dataset_is_replaced_whole_and_replace_keeps_other_files(tmp_path):
    generate_shapes(tmp_path / "fresh", seed=0, num_images=8, image_size=32)
    data = tmp_path / "data"
    generate_shapes(data, seed=1, num_images=12, image_size=32)     # more images than the next: none may stay
    generate_shapes(data, seed=0, num_images=8, image_size=32)
    assert _file_bytes(data) == _file_bytes(tmp_path / "fresh")
    (data / "notes.txt").write_text("mine")
    generate_shapes(data, seed=1, num_images=12, image_size=32, replace=True)
    generate_shapes(data, seed=0, num_images=8, image_size=32, replace=True)
    assert _file_bytes(data) == {**_file_bytes(tmp_path / "fresh"), Path("notes.txt"): b"mine"}


# ---------------------------------------------------------------------------------------- the captions


def test_five_captions_in_the_grammar_naming_every_object(shapes_dir):
    out, _ = shapes_dir
    objects = _objects(out)
    for image_id, captions in _captions_by_image(out).items():
        present = {(o["colour"], o["shape"]): o for o in objects[image_id]}
        assert len(captions) == 5
        for caption in captions:
            assert CAPTION_GRAMMAR.fullmatch(caption), caption
            mentions, relations = parse_caption(caption)
            named = {(m.colour, m.shape) for m in mentions}
            assert named == set(present), caption
            assert all(m.size in (None, present[(m.colour, m.shape)]["size"]) for m in mentions)
            allowed = {1: {0}, 2: {1}, 3: {1, 2}}[len(present)]  # 3 objects: 1 when one is related to none
            assert len(relations) in allowed, caption


def test_captions_vary(shapes_dir):
    out, _ = shapes_dir
    captions = _captions_by_image(out)
    multi = [texts for image_id, texts in captions.items() if len(parse_caption(texts[0])[0]) > 1]
    assert all(len(set(texts)) == 5 for texts in multi)
    all_texts = [text for texts in captions.values() for text in texts]
    for phrase in ("there is ", " small ", " large ", *RELATIONS):
        assert any(phrase in text for text in all_texts), phrase
    assert any(not text.startswith("there is") for text in all_texts)
    assert any(all(f" {size} " not in text for size in SIZES) for text in all_texts)


def test_stated_relations_are_unambiguous_and_true(shapes_dir):
    out, _ = shapes_dir
    objects = _objects(out)
    graded = 0
    for image_id, captions in _captions_by_image(out).items():
        boxes = {(o["colour"], o["shape"]): o["bbox"] for o in objects[image_id]}
        for caption in captions:
            mentions, relations = parse_caption(caption)
            for rel in relations:
                a = bbox_centre(boxes[(mentions[rel.subject_index].colour, mentions[rel.subject_index].shape)])
                b = bbox_centre(boxes[(mentions[rel.object_index].colour, mentions[rel.object_index].shape)])
                (dx, dy), stated = (a[0] - b[0], a[1] - b[1]), rel.relation
                major, minor = (dx, dy) if stated in RELATIONS[:2] else (dy, dx)
                assert abs(major) >= 2 * abs(minor) and abs(major) >= 32, caption
                assert (major < 0) == (stated in ("to the left of", "above")), caption
                assert is_unambiguous(a, b, 128) and relation_of(a, b) == stated
                graded += 1
    assert graded > 100


def test_ground_truth_captions_score_perfectly(shapes_dir):
    out, _ = shapes_dir
    objects, captions = _objects(out), _captions_by_image(out)
    for k in range(5):
        generated = {image_id: texts[k] for image_id, texts in captions.items()}
        scores = shapes_scores(generated, objects)
        assert scores["object_precision"] == 1.0 and scores["relation_accuracy"] == 1.0
        assert scores["mentions"] >= NUM_IMAGES and scores["relations_graded"] > 20


def test_captions_need_spatial_information():
    """Scenes with the same objects get different relations: the objects alone cannot tell the caption."""
    relations_by_objects = defaultdict(set)
    directions = Counter()
    for image_id in range(1, 1201):
        objects, captions = sample_scene(0, image_id, 128)
        if len(objects) != 2:
            continue
        first, second = sorted(objects, key=lambda o: (o.colour, o.shape))
        stated = relation_of(first.centre, second.centre)
        relations_by_objects[frozenset((o.size, o.colour, o.shape) for o in objects)].add(stated)
        directions[stated] += 1
    assert sum(len(found) > 1 for found in relations_by_objects.values()) >= 5
    assert set(directions) == set(RELATIONS)
    assert min(directions.values()) > 0.15 * sum(directions.values())


# ---------------------------------------------------------------------------------------- the measures


RED_LEFT_BLUE_RIGHT = {1: [{"shape": "circle", "colour": "red", "size": "small", "bbox": [10.0, 50.0, 20.0, 20.0]},
                           {"shape": "square", "colour": "blue", "size": "large", "bbox": [80.0, 60.0, 36.0, 36.0]}]}


def test_parse_caption_reads_mentions_sizes_and_relations():
    mentions, relations = parse_caption("there is a small red circle to the left of an orange square "
                                        "and a green triangle below the large orange square")
    assert mentions == [Mention("red", "circle", "small"), Mention("orange", "square"),
                        Mention("green", "triangle"), Mention("orange", "square", "large")]
    assert relations == [Relation(0, "to the left of", 1), Relation(2, "below", 3)]


@pytest.mark.parametrize("junk, mentions, relations", [
    ("", 0, 0), ("<unk> <unk> <unk>", 0, 0), ("to the left of above below", 0, 0), ("red", 0, 0),
    ("circle red a", 0, 0), ("a red circle to the", 1, 0), ("a red circle to the left of", 1, 0),
    ("a red <unk> circle above a blue square", 1, 0), ("a red circle and above a blue square", 2, 0),
    ("A Red Circle, to the LEFT of a blue square!", 2, 1), ("a red circle above <unk> a blue square", 2, 1),
    ("a a a small small red circle circle below below", 1, 0)])
def test_parse_caption_survives_junk(junk, mentions, relations):
    found_mentions, found_relations = parse_caption(junk)
    assert (len(found_mentions), len(found_relations)) == (mentions, relations)


@pytest.mark.parametrize("caption, precision, accuracy", [
    ("a red circle to the left of a blue square", 1.0, 1.0),
    ("a blue square to the right of a small red circle", 1.0, 1.0),
    ("a red circle to the right of a blue square", 1.0, 0.0),
    ("a blue square to the left of a red circle", 1.0, 0.0),
    ("a red circle above a blue square", 1.0, 0.0),            # it is higher, but the horizontal gap is larger
    ("a green circle to the left of a blue square", 0.5, None),  # not gradable: no green circle
    ("a red square and a green triangle", 0.0, None),
    ("a red circle to the left of a red circle", 1.0, 0.0),      # nothing is left of itself
    ("<unk> <unk>", 0.0, None)])
def test_measures_on_hand_made_captions(caption, precision, accuracy):
    generated = {1: caption}
    scores = shapes_scores(generated, RED_LEFT_BLUE_RIGHT)
    assert scores["object_precision"] == precision and scores["relation_accuracy"] == accuracy


def test_measures_pool_over_images():
    objects = {**RED_LEFT_BLUE_RIGHT, 2: [{"shape": "cross", "colour": "yellow", "size": "small",
                                           "bbox": [50.0, 10.0, 20.0, 20.0]},
                                          {"shape": "circle", "colour": "red", "size": "small",
                                           "bbox": [54.0, 90.0, 20.0, 20.0]}]}
    generated = {1: "a red circle to the left of a blue square", 2: "a yellow cross above a purple diamond "
                 "and a red circle above the yellow cross"}
    assert shapes_scores(generated, objects) == {"object_precision": 5 / 6, "relation_accuracy": 1 / 2,
                                                 "relations_graded": 2, "mentions": 6}
    with pytest.raises(CaptionerError, match="no objects for image 3"):
        shapes_scores({3: "a red circle"}, objects)


def test_load_shapes_objects(shapes_dir, tmp_path):
    out, _ = shapes_dir
    objects = load_shapes_objects(out / "annotations" / "instances_val.json")
    assert len(objects) == 6 and all(1 <= len(found) <= 3 for found in objects.values())
    assert set(next(iter(objects.values()))[0]) == {"shape", "colour", "size", "bbox"}
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"images": [{"id": 1}], "categories": [{"id": 1, "name": "dog"}],
                                 "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1]}]}))
    assert load_shapes_objects(plain) == {}
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"images": [{"id": 1}], "annotations": [{"image_id": 1, "colour": "red"}]}))
    with pytest.raises(CaptionerError, match="broken.json: not a COCO instances file"):
        load_shapes_objects(broken)
