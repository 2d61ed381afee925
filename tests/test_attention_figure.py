"""Attention figures for any grid and image shape, and upsample_attention's guarantees."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image

from captioner.visualisation.attention_figure import (
    draw_attention_figure,
    upsample_attention,
)

WORDS = ["a", "red", "circle", "<end>"]


def gradient_image(width: int = 200, height: int = 120, mode: str = "RGB") -> Image.Image:
    x = np.linspace(0, 255, width, dtype=np.uint8)
    y = np.linspace(0, 255, height, dtype=np.uint8)
    pixels = np.stack(np.broadcast_arrays(x[None, :], y[:, None], np.full((height, width), 128, np.uint8)), -1)
    return Image.fromarray(pixels).convert(mode)


def random_attention(steps: int, grid_height: int, grid_width: int) -> np.ndarray:
    weights = np.random.default_rng(0).random((steps, grid_height, grid_width))
    return weights / weights.sum(axis=(1, 2), keepdims=True)


def one_hot(grid_height: int, grid_width: int, row: int, column: int) -> np.ndarray:
    grid = np.zeros((grid_height, grid_width))
    grid[row, column] = 1.0
    return grid


@pytest.mark.parametrize("grid", [(7, 7), (14, 14), (3, 5)])
def test_figure_for_any_grid_on_a_non_square_image(tmp_path, grid):
    out = draw_attention_figure(gradient_image(), WORDS, random_attention(len(WORDS), *grid), tmp_path / "fig.png",
                                title="a red circle")
    assert out == tmp_path / "fig.png" and out.exists()
    with Image.open(out) as png:
        assert png.format == "PNG"
        width, height = png.size
    assert 400 <= width <= 3000 and 150 <= height <= 2000
    assert plt.get_fignums() == []


def test_chosen_cells_boxes_nearest_and_odd_images(tmp_path):
    attention = random_attention(len(WORDS), 3, 5)
    chosen = np.stack([one_hot(3, 5, step % 3, step) for step in range(len(WORDS))])
    chosen[-1] = 0  # a step without a sampled cell
    boxes = [[], [(20, 10, 60, 40)], [(20, 10, 60, 40), (150.5, 80.0, 40.0, 30.0)], []]
    out = draw_attention_figure(gradient_image(mode="RGBA"), WORDS, attention, tmp_path / "sub" / "hard.png",
                                chosen=chosen, boxes=boxes, columns=2, smooth=False)
    assert out.exists()
    tall = draw_attention_figure(gradient_image(30, 400, "L"), ["word"], random_attention(1, 14, 14),
                                 tmp_path / "tall.png")
    assert tall.exists()
    empty_caption = draw_attention_figure(gradient_image(), [], np.zeros((0, 7, 7)), tmp_path / "empty.png")
    assert empty_caption.exists()
    assert plt.get_fignums() == []


def test_mismatched_shapes_are_rejected(tmp_path):
    attention = random_attention(len(WORDS), 7, 7)
    with pytest.raises(ValueError, match="T = 3 words"):
        draw_attention_figure(gradient_image(), WORDS[:3], attention, tmp_path / "x.png")
    with pytest.raises(ValueError, match="chosen"):
        draw_attention_figure(gradient_image(), WORDS, attention, tmp_path / "x.png", chosen=attention[:, :3])
    with pytest.raises(ValueError, match="boxes"):
        draw_attention_figure(gradient_image(), WORDS, attention, tmp_path / "x.png", boxes=[[]])
    assert plt.get_fignums() == []


@pytest.mark.parametrize("smooth", [True, False])
@pytest.mark.parametrize(("grid", "size"), [((3, 5), (120, 200)), ((7, 7), (120, 200)), ((14, 14), (224, 224)),
                                            ((4, 3), (97, 61)), ((2, 2), (3, 3))])
def test_one_hot_argmax_stays_in_its_cell(grid, size, smooth):
    grid_height, grid_width = grid
    height, width = size
    step = 1 if grid_height * grid_width <= 49 else 3  # big grids: every third row and column, plus the last
    for row in sorted({*range(0, grid_height, step), grid_height - 1}):
        for column in sorted({*range(0, grid_width, step), grid_width - 1}):
            upsampled = upsample_attention(one_hot(grid_height, grid_width, row, column), size, smooth)
            assert upsampled.shape == size
            y, x = np.unravel_index(np.argmax(upsampled), size)
            assert row * height / grid_height <= y + 0.5 < (row + 1) * height / grid_height
            assert column * width / grid_width <= x + 0.5 < (column + 1) * width / grid_width


@pytest.mark.parametrize("smooth", [True, False])
def test_upsampled_map_is_a_distribution_when_the_input_is(smooth):
    attention = random_attention(1, 3, 5)[0]
    upsampled = upsample_attention(attention, (120, 200), smooth)
    assert upsampled.min() >= 0 and upsampled.sum() == pytest.approx(1.0)
    uniform = upsample_attention(np.full((7, 7), 1 / 49), (120, 200), smooth)
    assert np.allclose(uniform, 1 / (120 * 200))  # no darkening at the borders
    assert not upsample_attention(np.zeros((7, 7)), (10, 10), smooth).any()
    assert upsample_attention(np.array([[2.0, -1.0]]), (4, 4), smooth).sum() == pytest.approx(2.0)


def test_smooth_upsampling_is_smooth_and_nearest_is_blocky():
    attention = one_hot(3, 5, 1, 2)
    smooth = upsample_attention(attention, (120, 200), smooth=True)
    nearest = upsample_attention(attention, (120, 200), smooth=False)
    assert len(np.unique(nearest.round(12))) == 2
    assert (smooth > 1e-9).sum() > (nearest > 0).sum()


def test_upsample_rejects_bad_input():
    with pytest.raises(ValueError, match="gh, gw"):
        upsample_attention(np.ones(5), (10, 10))
    with pytest.raises(ValueError, match="NaN"):
        upsample_attention(np.array([[np.nan, 1.0]]), (10, 10))
    with pytest.raises(ValueError, match="size"):
        upsample_attention(np.ones((2, 2)), (0, 10))
