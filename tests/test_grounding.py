"""Attention grounding on constructed cases whose answers are known."""

import json
import re

import numpy as np
import pytest
import torch

from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import Generation
from captioner.errors import CaptionerError
from captioner.evaluation.coco_words import phrase_categories
from captioner.evaluation.grounding import (
    CocoTargets,
    ShapesTargets,
    Target,
    boxes_of_named_objects,
    cell_overlap,
    format_grounding,
    ground,
    ground_map,
    load_targets,
    named_objects,
)

GRID = (4, 4)
SIZE = (64, 64)                      # 16 px cells
BOX = [16.0, 16.0, 16.0, 16.0]       # exactly cell (1, 1)
OBJECTS = {7: [{"shape": "circle", "colour": "red", "size": "small", "bbox": BOX},
               {"shape": "square", "colour": "blue", "size": "large", "bbox": [36.0, 36.0, 20.0, 20.0]}]}
VOCAB = Vocabulary.build(["a red circle above a blue square", "a green triangle"], min_count=1)


def generation(caption: str, maps: list[np.ndarray], name: str = "alpha") -> Generation:
    tokens = VOCAB.encode(caption, 20)[1:-1]
    assert len(tokens) == len(maps)
    attention = torch.tensor(np.stack([m.reshape(-1) for m in maps]), dtype=torch.float32)
    return Generation(tokens=tokens, log_prob=0.0, attention={name: attention})


def one_hot(row: int, col: int) -> np.ndarray:
    cell = np.zeros(GRID)
    cell[row, col] = 1.0
    return cell


def uniform() -> np.ndarray:
    return np.full(GRID, 1.0 / (GRID[0] * GRID[1]))


def test_cell_overlap_is_the_area_fraction_of_each_cell():
    overlap = cell_overlap([8.0, 16.0, 16.0, 8.0], GRID, SIZE)  # half of cells (1,0) and (1,1), half their height
    expected = np.zeros(GRID)
    expected[1, 0] = expected[1, 1] = 0.25
    np.testing.assert_allclose(overlap, expected)
    assert cell_overlap([0.0, 0.0, 64.0, 64.0], GRID, SIZE).min() == 1.0


def test_attention_on_the_box_points_at_it_with_all_its_mass():
    hit, mass = ground_map(one_hot(1, 1), Target("circle", BOX), SIZE)
    assert hit and mass == pytest.approx(1.0)
    hit, mass = ground_map(one_hot(3, 0), Target("circle", BOX), SIZE)
    assert not hit and mass == 0.0


def test_uniform_attention_scores_chance_and_puts_the_box_area_fraction_inside():
    hit, mass = ground_map(uniform(), Target("circle", BOX), SIZE)
    assert hit == pytest.approx(1 / 16)          # a random cell among 16 lands on the box's one cell
    assert mass == pytest.approx(16 * 16 / (64 * 64))


def test_only_words_naming_exactly_one_present_object_count():
    words = "a red circle above a green triangle and a blue square".split()
    found = named_objects(words, OBJECTS[7])
    assert [(i, o["shape"]) for i, o in found] == [(2, "circle"), (10, "square")]  # green triangle is absent
    twins = [dict(OBJECTS[7][0]), dict(OBJECTS[7][0])]
    assert named_objects(["red", "circle"], twins) == []  # ambiguous: two red circles


def test_shapes_grounding_scores_model_and_baselines():
    caption = "a red circle above a blue square"
    background = uniform()
    maps = [background, background, one_hot(1, 1), background, background, background, one_hot(0, 0)]
    result = ground({7: generation(caption, maps)}, VOCAB, ShapesTargets(OBJECTS), {7: SIZE}, GRID)
    assert result["words"] == 2 and result["map"] == "alpha"
    assert result["pointing_accuracy"] == pytest.approx(0.5)          # circle hit, square missed
    assert result["per_word"]["circle"]["pointing_accuracy"] == 1.0
    assert result["per_word"]["square"]["pointing_accuracy"] == 0.0
    # uniform baseline: the circle's box overlaps 1 of 16 cells; the square's (36..56) overlaps 4
    assert result["uniform_pointing"] == pytest.approx((1 / 16 + 4 / 16) / 2)
    assert result["uniform_inside"] == pytest.approx((256 + 400) / 4096 / 2)
    # centre (32, 32): within half a cell (8 px) of the circle's box (16..32) and of the square's (36..56)
    assert result["centre_pointing"] == pytest.approx(1.0)


def test_hard_attention_is_judged_on_its_chosen_locations():
    caption = "a red circle"
    maps = [uniform(), uniform(), one_hot(1, 1)]
    gen = generation(caption, maps, name="chosen")
    gen.attention["alpha"] = torch.full((3, 16), 1 / 16)
    result = ground({7: gen}, VOCAB, ShapesTargets(OBJECTS), {7: SIZE}, GRID)
    assert result["map"] == "chosen" and result["pointing_accuracy"] == 1.0


def test_no_attention_maps_means_no_grounding():
    gen = Generation(tokens=VOCAB.encode("a red circle", 20)[1:-1], log_prob=0.0)
    assert ground({7: gen}, VOCAB, ShapesTargets(OBJECTS), {7: SIZE}, GRID) is None


# COCO: an L-shaped dog whose box covers a cell its mask does not, two people, one 64x64 image.
DOG_L = [2, 2, 30, 2, 30, 14, 14, 14, 14, 30, 2, 30]             # cells (0,0), (0,1), (1,0); its box also (1,1)
COCO_VOCAB = Vocabulary.build(["a puppy and a cat near two men", "a hot dog"], min_count=1)


def rectangle(x0, y0, x1, y1):
    return [x0, y0, x1, y0, x1, y1, x0, y1]


@pytest.fixture
def coco_targets(tmp_path):
    def annotation(k, category, polygon):
        xs, ys = polygon[0::2], polygon[1::2]
        return {"id": k, "image_id": 5, "category_id": category, "segmentation": [polygon], "iscrowd": 0,
                "area": 1.0, "bbox": [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]}
    instances = {"images": [{"id": 5, "width": 64, "height": 64, "file_name": "5.jpg"}],
                 "categories": [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}, {"id": 58, "name": "hot dog"}],
                 "annotations": [annotation(1, 18, DOG_L), annotation(2, 1, rectangle(50, 50, 62, 62)),
                                 annotation(3, 1, rectangle(2, 50, 14, 62))]}
    path = tmp_path / "instances_test.json"
    path.write_text(json.dumps(instances))
    targets = load_targets(path)
    assert isinstance(targets, CocoTargets)
    return targets


def test_coco_words_match_synonyms_plurals_and_phrases_first():
    words = "two men ride motor bikes past a hot dog stand and three teddy bears".split()
    assert [(words[i], c) for i, c in phrase_categories(words)] == [
        ("men", "person"), ("bikes", "motorcycle"), ("dog", "hot dog"), ("bears", "teddy bear")]
    assert phrase_categories("a puppy".split()) == [(1, "dog")]
    assert phrase_categories("a sunny day".split()) == []


def test_coco_target_is_the_union_of_instance_masks(coco_targets):
    dog = coco_targets.target(5, "dog")
    expected = np.zeros(GRID)
    expected[0, 0] = expected[0, 1] = expected[1, 0] = 1.0
    assert (dog.cell_fractions(GRID, SIZE) > 0).astype(float).tolist() == expected.tolist()
    assert cell_overlap(dog.box, GRID, SIZE)[1, 1] > 0                    # the box would cover (1, 1)
    people = coco_targets.target(5, "person").cell_fractions(GRID, SIZE)
    assert set(zip(*np.nonzero(people))) == {(3, 0), (3, 3)}
    assert coco_targets.target(5, "cat") is None


def test_coco_grounding_uses_masks_counts_only_present_categories_and_breaks_down(coco_targets):
    caption = "a puppy and a cat near two men"
    maps = [uniform(), one_hot(1, 1), uniform(), uniform(), one_hot(0, 0), uniform(), uniform(), one_hot(3, 0)]
    tokens = COCO_VOCAB.encode(caption, 20)[1:-1]
    gen = Generation(tokens=tokens, log_prob=0.0,
                     attention={"alpha": torch.tensor(np.stack([m.reshape(-1) for m in maps]), dtype=torch.float32)})
    result = ground({5: gen}, COCO_VOCAB, coco_targets, {5: SIZE}, GRID)
    assert result["words"] == 2                                          # "cat" names nothing in the image
    assert result["per_word"]["puppy"]["pointing_accuracy"] == 0.0       # (1, 1) is in the dog's box, not its mask
    assert result["per_word"]["men"]["pointing_accuracy"] == 1.0
    assert set(result["per_category"]) == {"dog", "person"}
    dog = result["per_category"]["dog"]
    assert dog["uniform_pointing"] == pytest.approx(3 / 16)
    assert dog["uniform_inside"] == pytest.approx(coco_targets.target(5, "dog").mask.mean())
    assert dog["centre_pointing"] == 0.0                                 # the centre is off the L, inside its box
    assert "per category:" in format_grounding(result) and "per word:" in format_grounding(result)


def test_boxes_of_named_objects_per_word_by_file_name(coco_targets, tmp_path):
    instances = tmp_path / "instances_test.json"
    words = "a dog and two people".split()
    boxes = boxes_of_named_objects(instances, tmp_path / "photos" / "5.jpg", words)
    assert boxes[0] == [] and boxes[2] == [] and boxes[3] == []
    assert boxes[1] == [[2.0, 2.0, 28.0, 28.0]]                              # the dog
    assert sorted(boxes[4]) == [[2.0, 50.0, 12.0, 12.0], [50.0, 50.0, 12.0, 12.0]]  # each person
    with pytest.raises(CaptionerError, match="instances_test.json: no image named 'other.jpg'"):
        boxes_of_named_objects(instances, "other.jpg", words)


def test_grounding_skips_images_the_instances_file_lacks_and_counts_them(coco_targets):
    caption = "a puppy near two men"
    tokens = COCO_VOCAB.encode(caption, 20)[1:-1]
    maps = torch.tensor(np.stack([one_hot(0, 0).reshape(-1)] * len(tokens)), dtype=torch.float32)
    generations = {5: Generation(tokens, 0.0, {"alpha": maps}), 99: Generation(tokens, 0.0, {"alpha": maps})}
    result = ground(generations, COCO_VOCAB, coco_targets, {5: SIZE}, GRID)
    assert result["images_grounded"] == 1 and result["images_without_objects"] == 1
    assert result["words"] == 2
    with pytest.raises(CaptionerError, match="none of the 1 images is in the instances file"):
        ground({99: generations[99]}, COCO_VOCAB, coco_targets, {5: SIZE}, GRID)


def test_grounding_takes_several_captions_of_one_image(coco_targets):
    caption = "a puppy near two men"
    tokens = COCO_VOCAB.encode(caption, 20)[1:-1]
    on_dog = torch.tensor(np.stack([one_hot(0, 0).reshape(-1)] * len(tokens)), dtype=torch.float32)
    pairs = [(5, Generation(tokens, 0.0, {"alpha": on_dog})), (5, Generation(tokens, 0.0, {"alpha": on_dog}))]
    result = ground(pairs, COCO_VOCAB, coco_targets, {5: SIZE}, GRID)
    assert result["words"] == 4 and result["images_grounded"] == 1
    assert result["per_word"]["puppy"]["pointing_accuracy"] == 1.0


@pytest.mark.parametrize(("content", "why"), [
    ({"images": [{"id": 1}], "annotations": [{"id": 1, "image_id": 1, "caption": "a dog"}]}, "no 'categories'"),
    ({"images": [{"id": 1}], "categories": [{"id": 1, "name": "dog"}]}, "not a COCO instances file"),
    ({"images": [{"id": 1}], "categories": [], "annotations": [{"id": 1, "bbox": [0, 0, 1, 1]}]}, "malformed COCO"),
    ({"images": [{"id": 1}], "categories": [], "annotations": []}, "an image without its size"),
], ids=["captions file", "no annotations", "annotation without image", "image without size"])
def test_an_instances_file_that_is_not_one_is_refused_in_one_line_naming_it(tmp_path, content, why):
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(content))
    with pytest.raises(CaptionerError, match=rf"instances\.json: .*{re.escape(why)}"):
        load_targets(path)
