"""Attention grounding on constructed cases whose answers are known."""

import numpy as np
import pytest
import torch

from captioner.data.vocabulary import Vocabulary
from captioner.decoding.search import Generation
from captioner.evaluation.grounding import cell_overlap, ground_map, named_objects, shapes_grounding

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
    hit, mass = ground_map(one_hot(1, 1), BOX, SIZE)
    assert hit and mass == pytest.approx(1.0)
    hit, mass = ground_map(one_hot(3, 0), BOX, SIZE)
    assert not hit and mass == 0.0


def test_uniform_attention_scores_chance_and_puts_the_box_area_fraction_inside():
    hit, mass = ground_map(uniform(), BOX, SIZE)
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
    result = shapes_grounding({7: generation(caption, maps)}, VOCAB, OBJECTS, {7: SIZE}, GRID)
    assert result["words"] == 2 and result["map"] == "alpha"
    assert result["pointing_accuracy"] == pytest.approx(0.5)          # circle hit, square missed
    assert result["per_word"]["circle"]["pointing_accuracy"] == 1.0
    assert result["per_word"]["square"]["pointing_accuracy"] == 0.0
    # uniform baseline: the circle's box overlaps 1 of 16 cells; the square's (36..56) overlaps 4
    assert result["uniform_pointing"] == pytest.approx((1 / 16 + 4 / 16) / 2)
    assert result["uniform_in_box"] == pytest.approx((256 + 400) / 4096 / 2)
    # centre (32, 32): within half a cell (8 px) of the circle's box (16..32) and of the square's (36..56)
    assert result["centre_pointing"] == pytest.approx(1.0)


def test_hard_attention_is_judged_on_its_chosen_locations():
    caption = "a red circle"
    maps = [uniform(), uniform(), one_hot(1, 1)]
    gen = generation(caption, maps, name="chosen")
    gen.attention["alpha"] = torch.full((3, 16), 1 / 16)
    result = shapes_grounding({7: gen}, VOCAB, OBJECTS, {7: SIZE}, GRID)
    assert result["map"] == "chosen" and result["pointing_accuracy"] == 1.0


def test_no_attention_maps_means_no_grounding():
    gen = Generation(tokens=VOCAB.encode("a red circle", 20)[1:-1], log_prob=0.0)
    assert shapes_grounding({7: gen}, VOCAB, OBJECTS, {7: SIZE}, GRID) is None
