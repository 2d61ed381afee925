"""Load any image file as a fully decoded RGB :class:`PIL.Image.Image`, or fail with one clear line.

:func:`load_image` turns every way a file (or the bytes of an upload) can be unusable (missing, empty, not an
image, truncated, corrupt, too large) into an :class:`~captioner.errors.ImageError` whose message starts with the
path; :func:`load_image_reduced` decodes a large image only as large as its caller needs. Images come back in mode
``"RGB"``, rotated as their EXIF orientation says, transparency composited on white, high bit depth scaled to 8
bits. :func:`image_transform` turns them into the tensors an encoder reads.

PIL's process-wide settings are left as the caller set them, except during one call, under a lock:
``Image.MAX_IMAGE_PIXELS`` is raised to a larger ``max_pixels``, and ``ImageFile.LOAD_TRUNCATED_IMAGES`` is
switched off (a truncated file must raise, not come back padded with grey).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import stat
import struct
import threading
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
import torch
from PIL import ExifTags, Image, ImageFile, ImageOps, UnidentifiedImageError
from torchvision.transforms import v2 as transforms

from captioner.errors import ImageError, first_line

DEFAULT_MAX_PIXELS = 64_000_000
"""Largest ``width * height`` :func:`load_image` accepts unless told otherwise (64 megapixels)."""

_WHITE = (255, 255, 255)
_PIL_SETTINGS_LOCK = threading.Lock()
# What PIL's decoders raise for corrupt or truncated data, besides DecompressionBombError.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error)


_RAISE_LIMIT = "raise the limit with --max-pixels N (caption, attend, serve) or the data.max_pixels setting"


def load_image(source: str | os.PathLike[str] | bytes | BinaryIO, *, max_pixels: int = DEFAULT_MAX_PIXELS,
               name: str | None = None) -> Image.Image:
    """Read and fully decode the image at ``source`` and return it as a new RGB image, sized after EXIF orientation.

    ``source`` is a file PIL reads (an animation's first frame), or its content as ``bytes`` or an open binary
    file; ``max_pixels`` the largest ``width * height`` accepted, checked before decoding; ``name`` how messages
    name the image (default: the path). Raises :class:`~captioner.errors.ImageError` ``"<name>: <reason>"`` for a
    missing, empty, truncated, corrupt or oversized file, or one that is not an image.
    """
    return _load(source, max_pixels, name, None)[0]


def load_image_reduced(source: str | os.PathLike[str] | bytes | BinaryIO, min_side: int, *,
                       max_pixels: int = DEFAULT_MAX_PIXELS, name: str | None = None
                       ) -> tuple[Image.Image, tuple[int, int]]:
    """:func:`load_image` for a caller that needs no more than ``min_side`` pixels on each side: a larger image
    is decoded smaller, by the largest integer factor that keeps both its sides at least ``min_side`` (JPEG in
    its decoder, any format by averaging blocks right after decoding), so that no copy is made at full size.
    Returns the image and the file's own ``(width, height)`` after EXIF orientation; ``ValueError`` for a
    ``min_side`` below 1."""
    if min_side < 1:
        raise ValueError(f"min_side must be at least 1, got {min_side}")
    return _load(source, max_pixels, name, min_side)


def _load(source, max_pixels: int, name: str | None, min_side: int | None) -> tuple[Image.Image, tuple[int, int]]:
    """:func:`load_image`, reduced as :func:`load_image_reduced` says when ``min_side`` is not None."""
    if isinstance(source, bytes):
        name = name or "<bytes>"
        if not source:
            raise ImageError(f"{name}: file is empty (0 bytes)")
        opened = io.BytesIO(source)
    elif hasattr(source, "read"):
        name = name or "<file>"
        if source.seek(0, io.SEEK_END) == 0:
            raise ImageError(f"{name}: file is empty (0 bytes)")
        source.seek(0)
        opened = source
    else:
        opened = os.fspath(source)
        name = name or opened
        _check_file(opened, name)
    with _strict_pil_settings(max_pixels):
        try:
            with Image.open(opened) as image:
                width, height = image.size
                if width * height > max_pixels:
                    raise ImageError(
                        f"{name}: image is {width}x{height} = {width * height} pixels, over the limit of "
                        f"{max_pixels} pixels (decompression bomb protection); {_RAISE_LIMIT}")
                if min_side is not None:
                    image.draft(None, (min_side, min_side))     # JPEG's decoder scales; other formats ignore it
                image.load()
                factor = 1 if min_side is None else min(image.size) // min_side
                orientation = 1 if min_side is None else _orientation(image)
                oriented = _transposed(_reduced(image, factor), orientation) if factor > 1 else _exif_oriented(image)
        except UnidentifiedImageError:
            raise ImageError(f"{name}: not an image file PIL can read") from None
        except Image.DecompressionBombError as error:  # PIL refuses at open() beyond twice its limit
            claimed = re.search(r"\((\d+) pixels\)", str(error))
            size = f"image has {claimed.group(1)} pixels" if claimed else "image is"
            raise ImageError(f"{name}: {size}, over the limit of {max_pixels} pixels (decompression bomb "
                             f"protection); {_RAISE_LIMIT}") from None
        except PermissionError:
            raise ImageError(f"{name}: permission denied") from None
        except _DECODE_ERRORS as error:
            raise ImageError(f"{name}: cannot decode the image data, the file is truncated or corrupt "
                             f"({first_line(error)})") from None
    try:
        rgb = to_rgb(oriented)
    except ValueError as error:
        raise ImageError(f"{name}: cannot convert a mode {oriented.mode} image to RGB ({first_line(error)})") from None
    return rgb, ((height, width) if orientation in _SWAPPING_ORIENTATIONS else (width, height))


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert a decoded image of any PIL mode to ``"RGB"``.

    Transparency (an alpha band, or a ``"transparency"`` entry from a palette or PNG tRNS chunk) is
    composited on white. High bit depth modes (``"I;16*"``, ``"I"``, ``"F"``) are scaled to 8 bits
    as :func:`_high_bit_depth_to_l` describes, not clipped. Raises ``ValueError`` for the few modes
    PIL cannot convert (e.g. ``"La"``).
    """
    if image.mode.startswith("I") or image.mode == "F":
        image = _high_bit_depth_to_l(image)
    if image.has_transparency_data:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, _WHITE + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def _high_bit_depth_to_l(image: Image.Image) -> Image.Image:
    """Scale a single-band ``"I;16*"``, ``"I"`` or ``"F"`` image to an 8-bit ``"L"`` image.

    * ``"I;16"``, ``"I;16B"``, ``"I;16L"`` and ``"I"`` with values in 0..65535: ``v / 257``, so 0 -> 0 and
      65535 -> 255.
    * ``"F"`` with values in [0, 1]: ``v * 255``; with values in [0, 255]: unchanged.
    * Anything else (negative values, larger ranges): stretched linearly from its min..max to 0..255.
      NaN counts as 0 and infinities as the largest finite values.
    """
    values = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if image.mode.startswith("I") and low >= 0 and high <= 65535:
        scaled = values / 257.0
    elif image.mode == "F" and low >= 0 and high <= 1:
        scaled = values * 255.0
    elif image.mode == "F" and low >= 0 and high <= 255:
        scaled = values
    elif high > low:
        scaled = (values - low) * (255.0 / (high - low))
    else:
        scaled = np.zeros_like(values)
    return Image.fromarray(np.clip(np.rint(scaled), 0, 255).astype(np.uint8))


def _check_file(path: str, name: str) -> None:
    """Raise :class:`ImageError` (naming ``name``) for a ``path`` that is missing, a directory, or empty."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ImageError(f"{name}: file not found") from None
    except OSError as error:
        raise ImageError(f"{name}: cannot read the file ({error.strerror or error})") from None
    if stat.S_ISDIR(info.st_mode):
        raise ImageError(f"{name}: is a directory, not an image file")
    if info.st_size == 0:
        raise ImageError(f"{name}: file is empty (0 bytes)")


def _exif_oriented(image: Image.Image) -> Image.Image:
    """A copy of ``image`` rotated/flipped as its EXIF orientation tag says (a plain copy without one)."""
    try:
        return ImageOps.exif_transpose(image)
    except (SyntaxError, ValueError, TypeError, KeyError, struct.error):
        # Unparseable EXIF metadata: the pixels are fine, so keep them as stored.
        return image.copy()


# What each EXIF orientation tag value asks for (1, or any other value: nothing).
_EXIF_TRANSPOSES = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
                    5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
                    8: Image.Transpose.ROTATE_90}
_SWAPPING_ORIENTATIONS = (5, 6, 7, 8)


def _orientation(image: Image.Image) -> int:
    """``image``'s EXIF orientation tag (1 when it has none or its metadata cannot be parsed)."""
    try:
        return int(image.getexif().get(ExifTags.Base.Orientation, 1))
    except (SyntaxError, ValueError, TypeError, KeyError, struct.error):
        return 1


def _transposed(image: Image.Image, orientation: int) -> Image.Image:
    """``image`` rotated/flipped as the EXIF ``orientation`` says (itself for 1 or an unknown value)."""
    method = _EXIF_TRANSPOSES.get(orientation)
    return image if method is None else image.transpose(method)


def _reduced(image: Image.Image, factor: int) -> Image.Image:
    """``image`` ``factor`` times smaller on each side (rounded up), each pixel the mean of the block it stands for;
    palette images become RGB(A), bilevel ones L and 16-bit ones I first (PIL averages none of those)."""
    if image.mode in ("P", "PA"):
        image = image.convert("RGBA" if image.has_transparency_data else "RGB")
    elif image.mode == "1":
        image = image.convert("L")
    elif image.mode.startswith("I;16"):
        image = image.convert("I")
    return image.reduce(factor)


@contextlib.contextmanager
def _strict_pil_settings(max_pixels: int) -> Iterator[None]:
    """Within the block, let PIL open images up to ``max_pixels`` and refuse truncated files.

    Nothing changes (and no lock is taken) when PIL's settings already allow that. Otherwise the
    settings are changed under a lock for the block only and restored afterwards, so concurrent
    :func:`load_image` calls never see each other's values.
    """
    pil_limit = Image.MAX_IMAGE_PIXELS
    raise_limit = pil_limit is not None and max_pixels > pil_limit
    if not raise_limit and not ImageFile.LOAD_TRUNCATED_IMAGES:
        yield
        return
    with _PIL_SETTINGS_LOCK:
        saved_limit, saved_truncated = Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES
        if saved_limit is not None and max_pixels > saved_limit:
            Image.MAX_IMAGE_PIXELS = max_pixels
        ImageFile.LOAD_TRUNCATED_IMAGES = False
        try:
            yield
        finally:
            Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES = saved_limit, saved_truncated


TO_FLOAT = transforms.ToDtype(torch.float32, scale=True)
"""uint8 pixels -> float in [0, 1]: the last step of :func:`image_transform`."""


def image_transform(encoder, to_float: bool = True) -> transforms.Compose:
    """PIL image -> ``(3, H, W)`` float tensor in [0, 1] at the encoder's input size and interpolation;
    ``to_float=False``: the uint8 pixels before :data:`TO_FLOAT` (a quarter of the bytes, e.g. to send)."""
    return transforms.Compose([
        transforms.PILToTensor(),
        transforms.Resize(list(encoder.image_size), interpolation=encoder.interpolation, antialias=True),
        *([TO_FLOAT] if to_float else []),
    ])
