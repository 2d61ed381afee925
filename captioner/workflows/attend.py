"""Attention figures of image files, what ``captioner attend`` does: where each figure goes
(:func:`figure_paths`), and each image captioned and drawn in turn (:func:`attend_images`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from captioner.errors import CaptionerError, ImageError

if TYPE_CHECKING:
    from captioner.predictor import CaptionResult, Predictor


def figure_paths(images: Sequence[str | Path], out: str | Path) -> list[Path]:
    """Where the figure of each of ``images`` goes. One image: ``out`` itself, or ``out/STEM.png`` when ``out`` is
    an existing folder; several: ``out`` is a folder (made when the first figure is written), ``out/STEM.png``
    each, a stem taken twice getting ``-2``, ``-3``. Raises :class:`~captioner.errors.CaptionerError` when several
    images are given a file (or a ``.png`` name) for ``out``."""
    out = Path(out)
    if len(images) == 1 and not out.is_dir():
        return [out]
    if len(images) > 1 and (out.is_file() or (out.suffix.lower() == ".png" and not out.exists())):
        raise CaptionerError(f"{out}: {len(images)} images need a folder for their figures (--out DIR), not a file")
    paths: list[Path] = []
    for image in images:
        stem, number = Path(image).stem, 1
        while (path := out / (f"{stem}.png" if number == 1 else f"{stem}-{number}.png")) in paths:
            number += 1
        paths.append(path)
    return paths


def attend_images(predictor: Predictor, images: Sequence[str | Path], figures: Sequence[Path], *,
                  instances: str | Path | None = None) -> Iterator[tuple[str | Path, Path, CaptionResult]]:
    """Caption each of ``images`` and draw its figure into the path of ``figures`` beside it
    (:meth:`~captioner.predictor.Predictor.attend`); yields ``(image, figure, result)`` as each is done. An image that
    cannot be read yields a result with its ``error``, and the others go on."""
    from captioner.predictor import CaptionResult

    for image, figure in zip(images, figures, strict=True):
        try:
            result = predictor.attend(image, figure, instances=instances)    # the figure's folder made as written
        except ImageError as err:
            result = CaptionResult(Path(image), error=str(err))
        yield image, figure, result
