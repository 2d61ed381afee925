"""load_image: bad files fail with one-line ImageErrors naming the file; odd but valid files come back RGB."""

import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile

from captioner.data.images import DEFAULT_MAX_PIXELS, load_image
from captioner.errors import CaptionerError, ImageError


def noise_image(width: int = 64, height: int = 48, mode: str = "RGB") -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert(mode)


def png_header_only(path, width: int, height: int) -> None:
    """A PNG whose header claims ``width x height`` pixels but holds no pixel data."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))


def assert_image_error(path, *words, **kwargs) -> str:
    with pytest.raises(ImageError) as caught:
        load_image(path, **kwargs)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    for word in words:
        assert word in message
    return message


def test_image_error_is_a_captioner_error():
    assert issubclass(ImageError, CaptionerError)


def test_missing_empty_directory_and_text_files(tmp_path):
    assert_image_error(tmp_path / "missing.jpg", "not found")
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    assert_image_error(empty, "empty")
    assert_image_error(tmp_path, "directory")
    text = tmp_path / "notes.jpg"
    text.write_text("this is not a picture\n")
    assert_image_error(text, "not an image")


@pytest.mark.parametrize("image_format", ["JPEG", "PNG"])
def test_truncated_files_raise_instead_of_returning_grey(tmp_path, image_format):
    whole = tmp_path / f"whole.{image_format.lower()}"
    noise_image(256, 256).save(whole, image_format)
    truncated = tmp_path / f"truncated.{image_format.lower()}"
    truncated.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert load_image(whole).size == (256, 256)
    assert_image_error(truncated, "truncated or corrupt")


def test_truncated_file_raises_even_if_pil_was_told_to_accept_them(tmp_path, monkeypatch):
    whole = tmp_path / "whole.jpg"
    noise_image(256, 256).save(whole)
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(whole.read_bytes()[:2000])
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    assert_image_error(truncated, "truncated")
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # the caller's setting is restored


def test_decompression_bomb_refused_from_the_header(tmp_path):
    bomb = tmp_path / "bomb.png"
    png_header_only(bomb, 9000, 9000)  # 81 MP: over the default limit, under PIL's own warning level
    assert 9000 * 9000 > DEFAULT_MAX_PIXELS
    message = assert_image_error(bomb, "9000x9000", str(DEFAULT_MAX_PIXELS), "max_pixels")
    assert "corrupt" not in message  # refused before any pixel data was read

    huge = tmp_path / "huge.png"
    png_header_only(huge, 20000, 10000)  # 200 MP: PIL itself refuses this at open
    assert_image_error(huge, "limit", "max_pixels")


def test_bytes_get_the_checks_of_files_under_the_name_given(tmp_path):
    """An upload's bytes: the same decoding and the same refusals as the file, named as the caller says."""
    path = tmp_path / "photo.jpg"
    noise_image(64, 48).save(path)
    data = path.read_bytes()
    assert np.array_equal(np.asarray(load_image(data)), np.asarray(load_image(path)))
    png_header_only(tmp_path / "bomb.png", 40000, 40000)
    cases = {b"": "empty", b"this is not a picture": "not an image", data[: len(data) // 2]: "truncated or corrupt",
             (tmp_path / "bomb.png").read_bytes(): "over the limit"}
    for content, words in cases.items():
        with pytest.raises(ImageError) as caught:
            load_image(content, name="upload photo.jpg")
        assert str(caught.value).startswith("upload photo.jpg: ") and words in str(caught.value)
    with pytest.raises(ImageError, match=r"^<bytes>: .*64x48"):
        load_image(data, max_pixels=100)


def test_max_pixels_is_per_call_and_leaves_pil_settings_alone(tmp_path):
    small = tmp_path / "small.png"
    noise_image(100, 100).save(small)
    assert_image_error(small, "100x100", "9999", max_pixels=9999)
    assert load_image(small, max_pixels=10_000).size == (100, 100)

    huge = tmp_path / "huge.png"
    png_header_only(huge, 20000, 10000)
    pil_limit = Image.MAX_IMAGE_PIXELS
    # Allowed past PIL's limit, the header-only file now fails at decoding, not at the size check.
    assert_image_error(huge, "truncated or corrupt", max_pixels=300_000_000)
    assert Image.MAX_IMAGE_PIXELS == pil_limit


def test_one_pixel_image(tmp_path):
    path = tmp_path / "dot.png"
    Image.new("RGB", (1, 1), (10, 20, 30)).save(path)
    image = load_image(path)
    assert image.mode == "RGB" and image.size == (1, 1) and image.getpixel((0, 0)) == (10, 20, 30)


@pytest.mark.parametrize(("mode", "suffix"), [
    ("1", "png"), ("L", "png"), ("LA", "png"), ("RGBA", "png"), ("P", "png"), ("P", "gif"),
    ("CMYK", "jpg"), ("CMYK", "tif"), ("I", "tif"), ("F", "tif"), ("YCbCr", "jpg"),
])
def test_every_mode_comes_back_rgb_at_the_right_size(tmp_path, mode, suffix):
    path = tmp_path / f"{mode}.{suffix}"
    noise_image(37, 23, mode).save(path)
    image = load_image(path)
    assert image.mode == "RGB" and image.size == (37, 23)
    image.load()  # already decoded and detached from the (closed) file


def test_transparency_is_composited_on_white(tmp_path):
    rgba = Image.new("RGBA", (4, 1), (255, 0, 0, 255))
    rgba.putpixel((1, 0), (255, 0, 0, 0))
    rgba.putpixel((2, 0), (0, 0, 0, 128))
    rgba.save(tmp_path / "rgba.png")
    image = load_image(tmp_path / "rgba.png")
    assert image.getpixel((0, 0)) == (255, 0, 0)
    assert image.getpixel((1, 0)) == (255, 255, 255)
    assert all(abs(channel - 127) <= 1 for channel in image.getpixel((2, 0)))

    gray_alpha = Image.new("LA", (2, 1), (0, 0))
    gray_alpha.save(tmp_path / "la.png")
    assert load_image(tmp_path / "la.png").getpixel((0, 0)) == (255, 255, 255)

    palette = Image.new("P", (2, 1), 0)
    palette.putpalette([0, 0, 255] + [0, 255, 0] * 255)
    palette.putpixel((1, 0), 1)
    palette.save(tmp_path / "p.png", transparency=0)
    image = load_image(tmp_path / "p.png")
    assert image.getpixel((0, 0)) == (255, 255, 255) and image.getpixel((1, 0)) == (0, 255, 0)
    palette.save(tmp_path / "p_opaque.png")
    assert load_image(tmp_path / "p_opaque.png").getpixel((0, 0)) == (0, 0, 255)


def test_16_bit_gradient_spans_0_to_255(tmp_path):
    gradient = np.tile(np.linspace(0, 65535, 256).round().astype(np.uint16), (8, 1))
    path = tmp_path / "gradient16.png"
    Image.fromarray(gradient).save(path)
    with Image.open(path) as stored:
        assert stored.mode.startswith("I")
    row = np.asarray(load_image(path))[0, :, 0].astype(int)
    assert row.min() == 0 and row.max() == 255
    assert np.all(np.diff(row) >= 0) and len(np.unique(row)) > 250
    assert np.abs(row - np.arange(256)).max() <= 1


def test_float_image_in_unit_range_is_scaled(tmp_path):
    ramp = np.tile(np.linspace(0, 1, 50, dtype=np.float32), (3, 1))
    path = tmp_path / "ramp.tif"
    Image.fromarray(ramp).save(path)
    row = np.asarray(load_image(path))[0, :, 0]
    assert row[0] == 0 and row[-1] == 255


def test_exif_orientation_is_applied(tmp_path):
    stored = Image.new("RGB", (40, 20), (0, 0, 255))
    stored.paste((255, 0, 0), (0, 0, 10, 10))  # red block at the stored top-left
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display"
    path = tmp_path / "rotated.jpg"
    stored.save(path, exif=exif.tobytes(), quality=95)
    image = load_image(path)
    assert image.size == (20, 40)
    red, green, blue = image.getpixel((15, 5))  # the block is now at the top-right
    assert red > 200 and blue < 60
