"""Paper-style attention figures (Xu et al. 2015, figures 2 and 3) and attention map upsampling.

:func:`draw_attention_figure` shows the image, then one panel per generated word in which the image
is dimmed except where the decoder attended. :func:`upsample_attention` turns one ``(gh, gw)`` map
over the encoder grid into an ``(H, W)`` map over the image; it is also what grounding measures use.

Figures are drawn on a bare :class:`matplotlib.figure.Figure` with the Agg canvas: nothing goes
through ``pyplot``, so no backend is switched, no window opens and no figure stays registered.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from PIL import Image

from captioner.core.files import write_file
from captioner.data.images import to_rgb

BLUR_SIGMA_PER_CELL = 0.3
"""Standard deviation of the smoothing blur, as a fraction of one grid cell (per axis)."""
DIMMED_BRIGHTNESS = 0.2
"""Brightness of the image where a word's attention is zero (1.0 where it is the panel's maximum)."""
DISPLAY_MAX_SIDE = 480
"""Panels show the image resampled so that its longer side has at most this many pixels."""
PANEL_INCHES = 2.4
"""Longer side of one panel, in inches (at 100 dpi)."""
MARGIN, GAP, WORD_TITLE = 0.1, 0.1, 0.3
"""Inches around the figure, between panels, and above a panel for its word."""
TITLE_CHARACTERS_PER_INCH = 11
"""How many characters of the 12-point title fit in an inch, to wrap it to the figure's width."""
PNG_COMPRESSION = 3
"""zlib level of the PNGs written: PIL's default, 6, spends more time compressing these blurred overlays than
drawing them, for files little smaller."""
CHOSEN_COLOR = "#ff3b30"
BOX_COLOR = "#00e5ff"

Box = tuple[float, float, float, float]


def upsample_attention(attention_map: np.ndarray, size: tuple[int, int], smooth: bool = True) -> np.ndarray:
    """Upsample one attention map ``(gh, gw)`` over the encoder grid to an ``(H, W)`` map over the image's pixels.

    Each grid cell covers an equal rectangle of the image. ``smooth``: bilinear, then a gaussian blur of
    :data:`BLUR_SIGMA_PER_CELL` cells; else each cell's value over exactly its own pixels. Negative weights count
    as 0. The float64 result keeps the map's total: a distribution over cells becomes one over pixels. Raises
    ``ValueError`` for a map that is empty, not 2-D or not finite.
    """
    weights = np.asarray(attention_map, dtype=np.float64)
    if weights.ndim != 2 or weights.size == 0:
        raise ValueError(f"attention map must be a non-empty (gh, gw) array, got shape {weights.shape}")
    if not np.all(np.isfinite(weights)):
        raise ValueError("attention map contains NaN or infinite values")
    height, width = (int(side) for side in size)
    if height < 1 or width < 1:
        raise ValueError(f"size must be (H, W) with H, W >= 1, got {size}")
    weights = np.clip(weights, 0.0, None)
    total = weights.sum()
    rows, columns = upsampling_operators(weights.shape, (height, width), smooth)
    upsampled = np.clip(rows @ weights @ columns.T, 0.0, None)
    upsampled_total = upsampled.sum()
    if upsampled_total <= 0:
        return np.zeros((height, width))
    return upsampled * (total / upsampled_total)


def upsampling_operators(grid: tuple[int, int], size: tuple[int, int], smooth: bool = True
                         ) -> tuple[np.ndarray, np.ndarray]:
    """The two matrices :func:`upsample_attention` applies: ``rows`` (H, gh) and ``columns`` (W, gw), so that
    a ``(gh, gw)`` map becomes ``rows @ map @ columns.T`` over ``(H, W)`` pixels (before clipping and
    rescaling to the map's total). The web page (``captioner serve``) draws its overlays with them."""
    (grid_height, grid_width), (height, width) = grid, size
    return _axis_operator(grid_height, height, smooth), _axis_operator(grid_width, width, smooth)


def draw_attention_figure(image: Image.Image, words: Sequence[str], attention: np.ndarray,
                          out_path: str | os.PathLike[str], *, chosen: np.ndarray | None = None,
                          boxes: Sequence[Sequence[Box]] | None = None, columns: int = 5, smooth: bool = True,
                          title: str | None = None) -> Path:
    """Draw the image and one attention panel per word; save it as a PNG at ``out_path`` (parent folders are
    created) and return that path.

    ``attention`` (T, gh, gw): one map per word, shown as the image dimmed to :data:`DIMMED_BRIGHTNESS` where
    the map is zero. ``chosen`` (T, gh, gw): hard attention's cells, outlined; ``boxes[t]``: boxes
    ``(x, y, w, h)`` in image pixels outlined on word t's panel. ``columns``:
    panels per row; ``smooth`` as in :func:`upsample_attention`; ``title`` above all panels.
    """
    attention, chosen = _checked_maps(words, attention, chosen, boxes, columns)
    width, height = image.size
    display = _display_image(image)
    panels = len(words) + 1
    columns = min(columns, panels)
    rows = math.ceil(panels / columns)
    inches_per_pixel = PANEL_INCHES / max(width, height)
    panel_width, panel_height = width * inches_per_pixel, height * inches_per_pixel
    legend_height = 0.3 if chosen is not None or boxes is not None else 0.0
    # Laid out by hand, in inches (a layout engine costs more than the drawing): panels GAP apart, each with
    # WORD_TITLE above it for its word, the caption's title above them all (wrapped to the figure's width) and
    # the legend below.
    figure_width = 2 * MARGIN + columns * panel_width + (columns - 1) * GAP
    title_lines = textwrap.wrap(title, width=max(20, int(figure_width * TITLE_CHARACTERS_PER_INCH))) if title else []
    title_height = 0.2 + 0.2 * len(title_lines) if title_lines else 0.0
    figure_height = 2 * MARGIN + title_height + rows * (WORD_TITLE + panel_height) + (rows - 1) * GAP + legend_height
    figure = Figure(figsize=(figure_width, figure_height), dpi=100)
    FigureCanvasAgg(figure)
    axes = _panel_axes(figure, panels, columns, (panel_width, panel_height), title_height)
    extent = (0, width, height, 0)  # data coordinates are image pixels, whatever the displayed resolution
    axes[0].imshow(display, extent=extent, interpolation="antialiased")
    for step, word in enumerate(words):
        _word_panel(axes[step + 1], display, (width, height), word, attention[step], smooth,
                    None if chosen is None else chosen[step], boxes[step] if boxes is not None else ())
    for ax in axes:
        ax.set_axis_off()
        ax.set_xlim(0, width)
        ax.set_ylim(height, 0)
    _legend(figure, chosen is not None, boxes is not None, MARGIN / figure_height)
    if title_lines:
        figure.suptitle("\n".join(title_lines), y=1 - MARGIN / figure_height, va="top", fontsize=12, parse_math=False)
    return save_png(figure, out_path)


def _panel_axes(figure: Figure, panels: int, columns: int, panel_size: tuple[float, float],
                title_height: float) -> list:
    """``panels`` axes of ``panel_size`` inches (width, height), ``columns`` to a row, GAP apart and WORD_TITLE
    below the one above, the first row ``title_height`` below the figure's top margin."""
    figure_width, figure_height = figure.get_size_inches()
    panel_width, panel_height = panel_size
    axes = []
    for panel in range(panels):
        row, column = divmod(panel, columns)
        left = MARGIN + column * (panel_width + GAP)
        bottom = figure_height - MARGIN - title_height - (row + 1) * (WORD_TITLE + panel_height) - row * GAP
        axes.append(figure.add_axes((left / figure_width, bottom / figure_height, panel_width / figure_width,
                                     panel_height / figure_height)))
    return axes


def save_png(figure: Figure, out_path: str | os.PathLike[str]) -> Path:
    """Write ``figure`` (on an Agg canvas, its background opaque) as an RGB PNG at zlib level
    :data:`PNG_COMPRESSION`; returns ``out_path`` as a :class:`~pathlib.Path`."""
    canvas = figure.canvas
    canvas.draw()
    rgb = Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3])
    return write_file(out_path, lambda handle: rgb.save(handle, format="png", compress_level=PNG_COMPRESSION))


def _checked_maps(words, attention, chosen, boxes, columns) -> tuple[np.ndarray, np.ndarray | None]:
    attention = np.asarray(attention, dtype=np.float64)
    steps = len(words)
    if attention.ndim != 3 or attention.shape[0] != steps:
        raise ValueError(f"attention must be (T, gh, gw) with T = {steps} words, got shape {attention.shape}")
    chosen = None if chosen is None else np.asarray(chosen)
    if chosen is not None and chosen.shape != attention.shape:
        raise ValueError(f"chosen must have the shape of attention {attention.shape}, got {chosen.shape}")
    if boxes is not None and len(boxes) != steps:
        raise ValueError(f"boxes must hold one list of boxes per word ({steps}), got {len(boxes)}")
    if columns < 1:
        raise ValueError(f"columns must be at least 1, got {columns}")
    return attention, chosen


def attention_overlay(display: np.ndarray, attention_map: np.ndarray, smooth: bool = True) -> np.ndarray:
    """``display`` (H, W, 3) in [0, 1] dimmed to :data:`DIMMED_BRIGHTNESS` where the map is zero and at full
    brightness where it peaks (the map scaled to its own maximum): one word's panel."""
    weights = upsample_attention(attention_map, display.shape[:2], smooth)
    peak = weights.max()
    scaled = weights / peak if peak > 0 else weights
    return display * (DIMMED_BRIGHTNESS + (1.0 - DIMMED_BRIGHTNESS) * scaled)[..., None]


def _word_panel(ax, display: np.ndarray, size: tuple[int, int], word: str, attention_map: np.ndarray, smooth: bool,
                chosen_map: np.ndarray | None, boxes: Sequence[Box]) -> None:
    """One word's panel: the overlay, the word as title, hard attention's chosen cell, ground-truth boxes."""
    (width, height), (grid_height, grid_width) = size, attention_map.shape
    cell_height, cell_width = height / grid_height, width / grid_width
    ax.imshow(attention_overlay(display, attention_map, smooth), extent=(0, width, height, 0), interpolation="antialiased")
    # where set_title puts it (6 points above the panel), without the layout pass that titles cost at each draw
    ax.annotate(str(word), (0.5, 1.0), xycoords="axes fraction", xytext=(0, 6), textcoords="offset points",
                ha="center", va="baseline", fontsize=11, parse_math=False, annotation_clip=False)
    if chosen_map is not None and np.any(chosen_map):
        row, column = np.unravel_index(np.argmax(chosen_map), chosen_map.shape)
        ax.add_patch(Rectangle((column * cell_width, row * cell_height), cell_width, cell_height,
                               fill=False, edgecolor=CHOSEN_COLOR, linewidth=2))
    for x, y, box_width, box_height in boxes:
        ax.add_patch(Rectangle((x, y), box_width, box_height, fill=False, edgecolor=BOX_COLOR,
                               linewidth=1.5, linestyle="--"))


def _legend(figure: Figure, chosen: bool, boxes: bool, bottom: float) -> None:
    """The legend of the outlines drawn, centred at the foot of the figure (``bottom``: its height's share)."""
    legend = []
    if chosen:
        legend.append(Patch(fill=False, edgecolor=CHOSEN_COLOR, linewidth=2, label="chosen cell (hard attention)"))
    if boxes:
        legend.append(Patch(fill=False, edgecolor=BOX_COLOR, linewidth=1.5, linestyle="--", label="ground-truth box"))
    if legend:
        figure.legend(handles=legend, loc="lower center", bbox_to_anchor=(0.5, bottom), ncol=len(legend), frameon=False,
                      fontsize=9, borderaxespad=0)


def _axis_operator(cells: int, pixels: int, smooth: bool) -> np.ndarray:
    """``(pixels, cells)`` matrix taking cell values to pixel values along one axis.

    Nearest: each pixel takes the value of the cell its centre lies in. Smooth: linear interpolation
    between cell centres (constant beyond the outer centres), then a gaussian blur along the pixel
    axis, normalised at every pixel so that a constant stays constant up to the borders.
    """
    centres = (np.arange(pixels) + 0.5) * (cells / pixels)  # pixel centres in cell units
    if not smooth:
        operator = np.zeros((pixels, cells))
        operator[np.arange(pixels), np.minimum(centres.astype(int), cells - 1)] = 1.0
        return operator
    position = np.clip(centres - 0.5, 0.0, cells - 1)
    below = np.floor(position).astype(int)
    above = np.minimum(below + 1, cells - 1)
    fraction = position - below
    operator = np.zeros((pixels, cells))
    np.add.at(operator, (np.arange(pixels), below), 1.0 - fraction)
    np.add.at(operator, (np.arange(pixels), above), fraction)

    sigma = BLUR_SIGMA_PER_CELL * pixels / cells
    radius = min(math.ceil(3 * sigma), pixels - 1)
    if radius < 1:
        return operator
    offsets = np.arange(-radius, radius + 1)
    kernel = np.exp(-0.5 * (offsets / sigma) ** 2)
    coverage = np.convolve(np.ones(pixels), kernel)[radius: radius + pixels]
    blurred = np.stack([np.convolve(operator[:, cell], kernel)[radius: radius + pixels] for cell in range(cells)],
                       axis=1)
    return blurred / coverage[:, None]


def _display_image(image: Image.Image) -> np.ndarray:
    """``image`` as RGB floats in [0, 1] (transparency on white), its longer side at most :data:`DISPLAY_MAX_SIDE`."""
    rgb = to_rgb(image)
    scale = DISPLAY_MAX_SIDE / max(rgb.size)
    if scale < 1:
        rgb = rgb.resize((max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale))), Image.BICUBIC)
    return np.asarray(rgb, dtype=np.float64) / 255.0
