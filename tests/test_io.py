"""imgfilter.io: reading (OpenCV semantics, EXIF orientation, damaged files), writing
(what each format holds, atomic replacement), output checks, and the samples."""

from __future__ import annotations

import io as stdio
import os
import stat
import struct
import subprocess
import sys
import threading
import types
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

import imgfilter.io as iio
from imgfilter import io_metadata, io_native, io_pillow, io_read, tiff
from imgfilter.errors import InputError, OutputError

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "samples"
BMP_ALPHA = hasattr(cv2, "IMWRITE_BMP_COMPRESSION_BITFIELDS")  # OpenCV >= 4.13

# What each extension must hold, written down independently of imgfilter.io's table.
HOLDS = {
    ".jpg": ({"uint8"}, {1, 3}),
    ".jpeg": ({"uint8"}, {1, 3}),
    ".png": ({"uint8", "uint16"}, {1, 3, 4}),
    ".tif": ({"uint8", "uint16", "float32"}, {1, 3, 4}),
    ".tiff": ({"uint8", "uint16", "float32"}, {1, 3, 4}),
    ".bmp": ({"uint8"}, {1, 3, 4} if BMP_ALPHA else {1, 3}),
    ".webp": ({"uint8"}, {1, 3, 4}),
    ".npy": ({"uint8", "uint16", "float32"}, {1, 3, 4}),
}
DTYPES = ["uint8", "uint16", "float32"]
COMBOS = [(ext, dt, ch) for ext in HOLDS for dt in DTYPES for ch in (1, 3, 4)]
ALLOWED = [c for c in COMBOS if c[1] in HOLDS[c[0]][0] and c[2] in HOLDS[c[0]][1]]
REFUSED = [c for c in COMBOS if c not in ALLOWED]


def ids(combo):
    ext, dt, ch = combo
    return f"{ext[1:]}-{dt}-{ch}ch"


def test_table_covers_each_extension_and_the_known_losses():
    assert set(iio.SUPPORTED_WRITE_EXTENSIONS) == set(HOLDS)
    # The combinations OpenCV silently degrades are among the refused ones.
    for combo in [(".jpg", "uint16", 3), (".jpg", "uint8", 4), (".png", "float32", 1)]:
        assert combo in REFUSED
    for combo in [(".bmp", "float32", 3), (".webp", "uint16", 1), (".jpeg", "float32", 1)]:
        assert combo in REFUSED


def sample_image(dtype: str, channels: int, h: int = 37, w: int = 53, seed: int = 0):
    """Random pixels with the extremes of the type; alpha 0 over coloured pixels."""
    rng = np.random.default_rng(seed)
    shape = (h, w) if channels == 1 else (h, w, channels)
    if dtype == "float32":
        img = (rng.standard_normal(shape) * 1000).astype(np.float32)
        img.flat[:6] = [0.0, -0.0, 1e-40, 3.4e38, -3.4e38, 0.5]
    else:
        top = np.iinfo(dtype).max
        img = rng.integers(0, top, shape, endpoint=True, dtype=dtype)
        img.flat[0], img.flat[1] = 0, top
    if channels == 4:
        img[: h // 3, :, 3] = 0  # fully transparent, colour underneath must survive
    return img


def smooth_image(channels: int, h: int = 48, w: int = 64):
    """A gradient JPEG can store closely."""
    y, x = np.mgrid[0:h, 0:w]
    base = (x * 255 // (w - 1) + y * 2).clip(0, 255).astype(np.uint8)
    if channels == 1:
        return base
    return np.dstack([base, base[::-1], 255 - base]).astype(np.uint8)


# ---------------------------------------------------------------------------------------
# Round trips and refusals


@pytest.mark.parametrize("combo", ALLOWED, ids=[ids(c) for c in ALLOWED])
def test_round_trip(tmp_path, combo):
    ext, dt, ch = combo
    out = tmp_path / f"img{ext}"
    lossy = ext in (".jpg", ".jpeg")
    img = smooth_image(ch) if lossy else sample_image(dt, ch)
    assert iio.write_image(out, img) == out
    back = iio.read_image(out)
    assert back.dtype == img.dtype and back.flags.c_contiguous
    # What OpenCV (NumPy, for .npy) itself reads from the file is what we read.
    theirs = np.load(out) if ext == ".npy" else cv2.imread(str(out), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(back, theirs)
    if lossy:
        assert back.shape == img.shape
        diff = np.abs(back.astype(int) - img.astype(int))
        assert diff.mean() < 1.5 and diff.max() <= 24
    elif ext == ".webp" and ch == 1:
        # WebP has no gray mode: three equal channels come back, nothing is lost.
        assert back.shape == img.shape + (3,)
        for c in range(3):
            np.testing.assert_array_equal(back[..., c], img)
    else:
        assert back.shape == img.shape
        np.testing.assert_array_equal(back, img)


@pytest.mark.parametrize("ext", [".JPG", ".Png", ".TIFF", ".Webp", ".BMP"])
def test_extension_case_does_not_matter(tmp_path, ext):
    img = sample_image("uint8", 3) if ext.lower() != ".jpg" else smooth_image(3)
    out = iio.write_image(tmp_path / f"x{ext}", img)
    assert iio.read_image(out).shape == img.shape


def test_float_tiff_keeps_nan_and_infinities(tmp_path):
    img = np.array([[np.nan, np.inf, -np.inf], [0.1, -2.5, 7.0]], np.float32)
    back = iio.read_image(iio.write_image(tmp_path / "f.tiff", np.dstack([img] * 3)))
    np.testing.assert_array_equal(back, np.dstack([img] * 3))


@pytest.mark.parametrize("combo", REFUSED, ids=[ids(c) for c in REFUSED])
def test_lossy_combination_refused(tmp_path, combo):
    ext, dt, ch = combo
    out = tmp_path / f"img{ext}"
    with pytest.raises(OutputError) as err:
        iio.write_image(out, sample_image(dt, ch))
    msg = str(err.value)
    assert str(out) in msg and "\n" not in msg
    assert "write ." in msg  # names an extension that can hold it
    suggestion = msg.rsplit("write ", 1)[1]
    if dt == "float32":
        assert ".tiff" in suggestion and ".png" not in suggestion
    elif dt == "uint16":
        assert ".png" in suggestion and ".jpg" not in suggestion
    else:  # uint8 with 4 channels
        assert ".png" in suggestion and "4 channels" in msg
    assert not out.exists() and list(tmp_path.iterdir()) == []
    # check_output refuses the same thing before any work is done.
    with pytest.raises(OutputError):
        iio.check_output(out, dtype=dt, channels=ch)


def test_refusal_messages_read_well(tmp_path):
    with pytest.raises(OutputError, match=r"JPEG holds 8-bit images only; write \.png or \.tiff"):
        iio.check_output(tmp_path / "a.jpg", dtype=np.uint16, channels=1)
    with pytest.raises(OutputError, match=r"PNG holds .* only; write \.tiff for float32"):
        iio.check_output(tmp_path / "a.png", dtype="float32")
    with pytest.raises(OutputError, match=r"JPEG holds 1- or 3-channel images only"):
        iio.check_output(tmp_path / "a.jpeg", channels=4)


@pytest.mark.parametrize(
    ("img", "words"),
    [
        (np.zeros((4, 4), np.int16), "int16"),
        (np.zeros((4, 4), np.float64), "float64"),
        (np.zeros((4, 4), bool), "bool"),
        (np.zeros((4, 4, 2), np.uint8), "2-channel"),
        (np.zeros((4, 4, 5), np.uint8), "5-channel"),
        (np.zeros(16, np.uint8), "shape"),
        (np.zeros((0, 4), np.uint8), "shape"),
    ],
)
def test_unwritable_arrays_refused(tmp_path, img, words):
    out = tmp_path / "x.tiff"
    with pytest.raises(OutputError, match=words):
        iio.write_image(out, img)
    assert not out.exists()


def test_single_channel_axis_is_written_as_gray(tmp_path):
    img = sample_image("uint16", 1)
    back = iio.read_image(iio.write_image(tmp_path / "g.png", img[:, :, None]))
    np.testing.assert_array_equal(back, img)


def test_non_contiguous_input_is_written(tmp_path):
    img = sample_image("uint8", 3, w=80)[:, ::2]
    back = iio.read_image(iio.write_image(tmp_path / "nc.png", img))
    np.testing.assert_array_equal(back, img)


def test_webp_alpha_through_pillow_is_exact(tmp_path):
    """The path used where OpenCV has no IMWRITE_WEBP_LOSSLESS_PRESERVE_COLOR (< 4.13)."""
    img = sample_image("uint8", 4)
    data = io_metadata.pillow_encode(tmp_path / "x.webp", "WebP", img, None, None)
    back = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    np.testing.assert_array_equal(back, img)


# ---------------------------------------------------------------------------------------
# EXIF orientation


def exif_bytes(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def upright(a: np.ndarray, orientation: int) -> np.ndarray:
    """The EXIF meaning of each orientation value, spelled with numpy's named operations."""
    ops = {
        1: lambda a: a,
        2: np.fliplr,
        3: lambda a: np.rot90(a, 2),
        4: np.flipud,
        5: lambda a: np.fliplr(np.rot90(a, -1)),
        6: lambda a: np.rot90(a, -1),
        7: lambda a: np.fliplr(np.rot90(a, 1)),
        8: lambda a: np.rot90(a, 1),
    }
    return ops[orientation](a)


ORIENTATIONS = range(1, 9)
RGB = smooth_image(3, h=24, w=40)[..., ::-1]  # not square, so rotations show


@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_jpeg_orientation_matches_cv2_imread(tmp_path, orientation):
    path = tmp_path / f"o{orientation}.jpg"
    Image.fromarray(np.ascontiguousarray(RGB)).save(path, exif=exif_bytes(orientation))
    img = iio.read_image(path)
    ref = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert img.flags.c_contiguous
    np.testing.assert_array_equal(img, ref)
    if orientation >= 5:
        assert img.shape[:2] == RGB.shape[1::-1]


@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_gray_jpeg_orientation_matches_cv2_imread(tmp_path, orientation):
    path = tmp_path / f"g{orientation}.jpg"
    Image.fromarray(smooth_image(1, 24, 40)).save(path, exif=exif_bytes(orientation))
    img = iio.read_image(path)
    assert img.ndim == 2
    np.testing.assert_array_equal(img, cv2.imread(str(path), cv2.IMREAD_GRAYSCALE))


@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_png_orientation_matches_cv2_imread_and_keeps_alpha(tmp_path, orientation):
    rgba = np.dstack([RGB, np.arange(24 * 40, dtype=np.uint8).reshape(24, 40)])
    path = tmp_path / f"o{orientation}.png"
    Image.fromarray(np.ascontiguousarray(rgba)).save(path, exif=exif_bytes(orientation))
    img = iio.read_image(path)
    assert img.shape[2] == 4
    np.testing.assert_array_equal(img[..., :3], cv2.imread(str(path), cv2.IMREAD_COLOR))
    np.testing.assert_array_equal(img[..., 3], upright(rgba[..., 3], orientation))


@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_16bit_png_orientation_matches_cv2_imread(tmp_path, orientation):
    gray = (np.arange(24 * 40, dtype=np.uint16).reshape(24, 40) * 61).astype(np.uint16)
    path = tmp_path / f"o{orientation}.png"
    Image.fromarray(gray).save(path, exif=exif_bytes(orientation))
    img = iio.read_image(path)
    assert img.dtype == np.uint16
    np.testing.assert_array_equal(img, cv2.imread(str(path), cv2.IMREAD_ANYDEPTH))
    np.testing.assert_array_equal(img, upright(gray, orientation))


@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_webp_orientation_applied(tmp_path, orientation):
    path = tmp_path / f"o{orientation}.webp"
    src = np.ascontiguousarray(RGB)
    Image.fromarray(src).save(path, lossless=True, exif=exif_bytes(orientation))
    img = iio.read_image(path)
    np.testing.assert_array_equal(img, upright(src, orientation)[..., ::-1])
    if int(cv2.__version__.split(".")[0]) >= 5:  # OpenCV 4.x ignores WebP EXIF
        np.testing.assert_array_equal(img, cv2.imread(str(path), cv2.IMREAD_COLOR))


@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_tiff_orientation_applied_once(tmp_path, orientation):
    """OpenCV's TIFF decoder applies the tag itself; it must not be applied twice."""
    path = tmp_path / f"o{orientation}.tif"
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(np.ascontiguousarray(RGB)).save(path, exif=exif)
    np.testing.assert_array_equal(iio.read_image(path), upright(RGB, orientation)[..., ::-1])


def test_orientation_outside_1_to_8_is_ignored(tmp_path):
    path = tmp_path / "o9.jpg"
    Image.fromarray(np.ascontiguousarray(RGB)).save(path, exif=exif_bytes(9))
    np.testing.assert_array_equal(iio.read_image(path), cv2.imread(str(path)))


@pytest.mark.parametrize("byteorder", ["II", "MM"])
def test_exif_parser_reads_both_byte_orders(byteorder):
    e = "<" if byteorder == "II" else ">"
    ifd = struct.pack(e + "H", 2)
    ifd += struct.pack(e + "HHIHH", 0x010F, 2, 4, 0, 0)  # Make (ignored)
    ifd += struct.pack(e + "HHIHH", 0x0112, 3, 1, 6, 0)  # Orientation = 6
    payload = byteorder.encode() + struct.pack(e + "HI", 42, 8) + ifd + b"\0\0\0\0"
    assert io_pillow.exif_orientation(payload) == 6
    assert io_pillow.exif_orientation(b"Exif\x00\x00" + payload) == 6
    assert io_pillow.exif_orientation(payload[:20]) is None  # cut inside the entry
    assert io_pillow.exif_orientation(b"garbage") is None


# ---------------------------------------------------------------------------------------
# Inputs that must fail with one line naming the file


def encoded(ext: str, img=None) -> bytes:
    img = smooth_image(3, 96, 128) if img is None else img
    ok, buf = cv2.imencode(ext, img)
    assert ok
    return buf.tobytes()


def jpeg_bytes(**kw) -> bytes:
    out = stdio.BytesIO()
    Image.fromarray(smooth_image(3, 96, 128)).save(out, "JPEG", **kw)
    return out.getvalue()


def assert_input_error(path: Path, *words: str) -> str:
    with pytest.raises(InputError) as err:
        iio.read_image(path)
    msg = str(err.value)
    assert str(path) in msg, msg
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_missing_file(tmp_path):
    assert_input_error(tmp_path / "nope.png", "no such file")


def test_directory(tmp_path):
    assert_input_error(tmp_path, "directory")


def test_zero_byte_file(tmp_path):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    assert_input_error(empty, "empty")


@pytest.mark.parametrize("name", ["notes.png", "notes.jpg", "notes.txt", "notes"])
def test_text_file(tmp_path, name):
    path = tmp_path / name
    path.write_text("this is not an image\n" * 20)
    assert_input_error(path, "not an image")


def test_random_bytes(tmp_path):
    path = tmp_path / "noise.tif"
    path.write_bytes(np.random.default_rng(3).integers(0, 256, 4000, dtype=np.uint8).tobytes())
    assert_input_error(path)


def test_permission_denied(tmp_path, monkeypatch):
    path = tmp_path / "secret.png"
    path.write_bytes(encoded(".png"))
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):  # root reads anything: simulate the refusal instead
            real_open = os.open

            def refuse(p, *args, **kwargs):
                if Path(p) == path:
                    raise PermissionError(13, "Permission denied", str(p))
                return real_open(p, *args, **kwargs)

            monkeypatch.setattr(os, "open", refuse)
        assert_input_error(path, "permission denied")
    finally:
        path.chmod(0o600)


@pytest.mark.parametrize(
    ("name", "data", "keep", "words"),
    [
        ("half.jpg", jpeg_bytes(), 0.5, "truncated JPEG"),
        ("no_eoi.jpg", jpeg_bytes(), -2, "truncated JPEG"),  # only the EOI marker missing
        ("header.jpg", jpeg_bytes(), 0.02, "truncated JPEG"),
        ("progressive.jpg", jpeg_bytes(progressive=True), 0.6, "truncated JPEG"),
        ("half.png", encoded(".png"), 0.5, "truncated PNG"),
        ("no_iend.png", encoded(".png"), -12, "truncated PNG"),  # only IEND missing
        ("half.webp", encoded(".webp"), 0.5, "truncated WebP"),
        ("half.tiff", encoded(".tiff"), 0.5, "corrupt or unsupported TIFF"),
        ("half.bmp", encoded(".bmp"), 0.5, "corrupt or unsupported BMP"),
    ],
)
def test_truncated_file(tmp_path, name, data, keep, words):
    """A file cut short is an error, never an image with a grey-filled bottom.

    (OpenCV 4.x decodes a JPEG cut in half into a full-size image and only warns; 5.0
    returns None. The checks of the JPEG/PNG/WebP structure catch it either way.)
    """
    path = tmp_path / name
    path.write_bytes(data[:keep] if isinstance(keep, int) else data[: int(len(data) * keep)])
    assert_input_error(path, words)


def test_corrupt_png_checksum(tmp_path):
    """Damaged IDAT bytes: libpng fails on the CRC; Pillow alone would return garbage."""
    data = bytearray(encoded(".png"))
    data[len(data) // 2 : len(data) // 2 + 50] = b"\0" * 50
    path = tmp_path / "damaged.png"
    path.write_bytes(bytes(data))
    assert_input_error(path, "corrupt PNG", "IDAT")


def test_truncated_jpeg_with_eoi_bytes_in_a_header_segment(tmp_path):
    """An FF D9 inside a header segment (say an EXIF thumbnail) is not the image's end."""
    data = jpeg_bytes()
    comment = b"\xff\xfe" + (2 + 6).to_bytes(2, "big") + b"ab\xff\xd9cd"
    data = data[:2] + comment + data[2:]
    path = tmp_path / "cut.jpg"
    path.write_bytes(data[: len(data) // 2])
    assert_input_error(path, "truncated JPEG")
    whole = tmp_path / "whole.jpg"
    whole.write_bytes(data)
    np.testing.assert_array_equal(iio.read_image(whole), cv2.imread(str(whole)))


def test_junk_between_jpeg_segments_is_tolerated_like_libjpeg(tmp_path):
    data = jpeg_bytes()
    app0_end = 4 + int.from_bytes(data[4:6], "big")  # SOI (2) + APP0 marker (2) + length
    path = tmp_path / "junk.jpg"
    path.write_bytes(data[:app0_end] + b"\0\1\2" + data[app0_end:])
    np.testing.assert_array_equal(iio.read_image(path), cv2.imread(str(path)))


@pytest.mark.parametrize("ext", [".jpg", ".png", ".webp"])
def test_trailing_bytes_after_the_end_are_accepted(tmp_path, ext):
    path = tmp_path / f"tail{ext}"
    path.write_bytes(encoded(ext) + b"\0" * 64 + b"trailer")
    np.testing.assert_array_equal(iio.read_image(path), cv2.imread(str(path), -1))


def test_decoder_chatter_is_not_printed(tmp_path, capfd):
    png = tmp_path / "cut.png"
    data = encoded(".png")
    png.write_bytes(data[:-12])  # no IEND: libpng would print an error
    bad = bytearray(jpeg_bytes())
    bad[len(bad) // 2 : len(bad) // 2 + 400] = b"\x55" * 400  # corrupt scan data, EOI kept
    jpg = tmp_path / "mangled.jpg"
    jpg.write_bytes(bytes(bad))
    broken_png = bytearray(data)
    broken_png[len(data) // 2 : len(data) // 2 + 50] = b"\0" * 50  # IDAT damaged, IEND kept
    png2 = tmp_path / "damaged.png"
    png2.write_bytes(bytes(broken_png))
    capfd.readouterr()
    with pytest.raises(InputError):
        iio.read_image(png)
    with pytest.raises(InputError, match="damaged.png"):
        iio.read_image(png2)
    iio.read_image(jpg)  # libjpeg warns ("Corrupt JPEG data") but decodes, as cv2.imread does
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_opencv_log_level_restored(tmp_path):
    log = getattr(cv2.utils, "logging", cv2)  # OpenCV < 4.9 has cv2.getLogLevel
    before = log.getLogLevel()
    log.setLogLevel(4)  # INFO
    try:
        iio.read_image(SAMPLES / "camera.png")
        iio.write_image(tmp_path / "x.tiff", sample_image("uint8", 4))
        assert log.getLogLevel() == 4
    finally:
        log.setLogLevel(before)


# ---------------------------------------------------------------------------------------
# Pillow fallback and dtype normalisation


def pil_bytes(im: Image.Image, fmt: str, **kw) -> bytes:
    out = stdio.BytesIO()
    im.save(out, fmt, **kw)
    return out.getvalue()


RGB_IM = Image.fromarray(np.ascontiguousarray(smooth_image(3, 20, 30)[..., ::-1]))
FALLBACK_CASES = {
    "rgb.png": pil_bytes(RGB_IM, "PNG"),
    "rgba.png": pil_bytes(RGB_IM.convert("RGBA"), "PNG"),
    "gray.png": pil_bytes(RGB_IM.convert("L"), "PNG"),
    "la.png": pil_bytes(RGB_IM.convert("LA"), "PNG"),
    "palette.png": pil_bytes(RGB_IM.convert("P"), "PNG"),
    "palette_trns.png": pil_bytes(RGB_IM.convert("P"), "PNG", transparency=3),
    "bilevel.png": pil_bytes(RGB_IM.convert("1"), "PNG"),
    "gray16.png": encoded(".png", sample_image("uint16", 1)),
    "float.tiff": encoded(".tiff", sample_image("float32", 1)),
    "rgb.jpg": pil_bytes(RGB_IM, "JPEG"),
    "gray.webp": pil_bytes(RGB_IM.convert("L"), "WEBP", lossless=True),
    "rgba.webp": pil_bytes(RGB_IM.convert("RGBA"), "WEBP", lossless=True),
}


@pytest.mark.parametrize("name", sorted(FALLBACK_CASES))
def test_pillow_fallback_reads_what_opencv_reads(tmp_path, monkeypatch, name):
    path = tmp_path / name
    path.write_bytes(FALLBACK_CASES[name])
    via_opencv = iio.read_image(path)
    monkeypatch.setattr(cv2, "imdecode", lambda *a, **k: None)  # OpenCV "cannot decode"
    via_pillow = iio.read_image(path)
    assert via_pillow.dtype == via_opencv.dtype and via_pillow.flags.c_contiguous
    if name.endswith(".jpg"):  # two JPEG decoders: close, not identical
        assert via_pillow.shape == via_opencv.shape
        assert np.abs(via_pillow.astype(int) - via_opencv).max() <= 4
    else:
        np.testing.assert_array_equal(via_pillow, via_opencv)


@pytest.mark.parametrize("ext", [".png", ".tiff"])
@pytest.mark.parametrize("channels", [3, 4])
def test_pillow_fallback_refuses_to_narrow_16_bit_colour(tmp_path, monkeypatch, ext, channels):
    """Pillow has no 16-bit RGB mode; it would silently return 8 bits."""
    path = tmp_path / f"deep{ext}"
    path.write_bytes(encoded(ext, sample_image("uint16", channels)))
    assert iio.read_image(path).dtype == np.uint16
    monkeypatch.setattr(cv2, "imdecode", lambda *a, **k: None)
    monkeypatch.setattr(tiff, "read", lambda *a, **k: None)  # a TIFF layout it leaves to OpenCV
    assert_input_error(path, "16-bit")


def test_pillow_fallback_applies_orientation(tmp_path, monkeypatch):
    path = tmp_path / "o6.png"
    Image.fromarray(np.ascontiguousarray(RGB)).save(path, exif=exif_bytes(6))
    monkeypatch.setattr(cv2, "imdecode", lambda *a, **k: None)
    np.testing.assert_array_equal(iio.read_image(path), upright(RGB, 6)[..., ::-1])


@pytest.mark.parametrize(("fmt", "ext"), [("TGA", ".tga"), ("ICO", ".ico"), ("GIF", ".gif")])
def test_formats_only_pillow_may_know(tmp_path, fmt, ext):
    path = tmp_path / f"x{ext}"
    path.write_bytes(pil_bytes(RGB_IM.convert("P") if fmt == "GIF" else RGB_IM, fmt))
    img = iio.read_image(path)
    ref = np.asarray(Image.open(path).convert("RGB"))[..., ::-1]
    np.testing.assert_array_equal(img, ref)


def test_int32_tiff_within_16_bits_becomes_uint16(tmp_path):
    path = tmp_path / "i32.tiff"
    data = np.arange(12 * 9, dtype=np.int32).reshape(12, 9) * 600
    Image.fromarray(data).save(path)
    img = iio.read_image(path)
    assert img.dtype == np.uint16
    np.testing.assert_array_equal(img, data)


def test_int32_tiff_with_negative_values_is_refused(tmp_path):
    path = tmp_path / "neg.tiff"
    Image.fromarray(np.arange(-5, 7, dtype=np.int32).reshape(3, 4)).save(path)
    assert_input_error(path, "int32")


def test_float64_tiff_exact_in_float32_becomes_float32(tmp_path):
    path = tmp_path / "f64.tiff"
    data = np.linspace(-4, 4, 48).reshape(6, 8).astype(np.float32).astype(np.float64)
    path.write_bytes(encoded(".tiff", data))
    img = iio.read_image(path)
    assert img.dtype == np.float32
    np.testing.assert_array_equal(img, data)


def test_float64_tiff_needing_double_precision_is_refused(tmp_path):
    path = tmp_path / "f64.tiff"
    path.write_bytes(encoded(".tiff", np.full((4, 4), 0.1, np.float64)))
    assert_input_error(path, "float64")


def test_normalize_bool_and_two_channels():
    p = Path("x.png")
    mask = np.array([[True, False]])
    np.testing.assert_array_equal(io_read.normalize(mask, p), [[255, 0]])
    ga = np.dstack([np.full((2, 2), 7, np.uint8), np.full((2, 2), 9, np.uint8)])
    np.testing.assert_array_equal(io_read.normalize(ga, p)[0, 0], [7, 7, 7, 9])


# ---------------------------------------------------------------------------------------
# check_output, default_output, overwriting


def test_default_output_beside_input(tmp_path):
    assert iio.default_output(tmp_path / "photo.jpg", "blur") == tmp_path / "photo.blur.jpg"
    assert iio.default_output("a.b.PNG", "contour") == Path("a.b.contour.PNG")
    assert iio.default_output(tmp_path / "anim.gif", "blur") == tmp_path / "anim.blur.png"


def test_check_output_returns_the_path(tmp_path):
    assert iio.check_output(str(tmp_path / "o.tif"), dtype="float32", channels=3) == (
        tmp_path / "o.tif"
    )


@pytest.mark.parametrize("name", ["out.xyz", "out", "out.gif"])
def test_unsupported_extension(tmp_path, name):
    with pytest.raises(OutputError, match="not a supported image format") as err:
        iio.check_output(tmp_path / name)
    assert (name.split(".")[-1] if "." in name else "no extension") in str(err.value)
    with pytest.raises(OutputError):
        iio.write_image(tmp_path / name, sample_image("uint8", 3))
    assert not (tmp_path / name).exists()


def test_missing_directory(tmp_path):
    with pytest.raises(OutputError, match="does not exist"):
        iio.write_image(tmp_path / "no" / "dir" / "o.png", sample_image("uint8", 1))
    assert not (tmp_path / "no").exists()


def test_parent_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="not a directory"):
        iio.check_output(tmp_path / "file" / "o.png")


def test_target_is_a_directory(tmp_path):
    (tmp_path / "d.png").mkdir()
    with pytest.raises(OutputError, match="is a directory"):
        iio.write_image(tmp_path / "d.png", sample_image("uint8", 1), overwrite=True)


def test_unwritable_directory(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: simulate the refusal
            real_access = os.access
            monkeypatch.setattr(
                os, "access", lambda p, m: False if Path(p) == locked else real_access(p, m)
            )
        with pytest.raises(OutputError, match="not writable"):
            iio.write_image(locked / "o.png", sample_image("uint8", 1))
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


def test_existing_output_needs_overwrite(tmp_path):
    out = tmp_path / "o.png"
    out.write_bytes(b"keep me")
    with pytest.raises(OutputError, match=r"o\.png exists; pass overwrite=True") as info:
        iio.check_output(out)
    assert info.value.cli_message.endswith("pass --force to overwrite")  # the CLI's words
    with pytest.raises(OutputError, match="exists; pass overwrite=True"):
        iio.write_image(out, sample_image("uint8", 3))
    assert out.read_bytes() == b"keep me"
    img = sample_image("uint8", 3)
    iio.write_image(out, img, overwrite=True)
    np.testing.assert_array_equal(iio.read_image(out), img)


def test_a_directory_or_dash_as_output_says_what_is_wrong(tmp_path):
    with pytest.raises(OutputError, match="it is a directory; give a file name inside it"):
        iio.check_output(tmp_path)
    with pytest.raises(OutputError, match=r"cannot write to standard output \(-\)"):
        iio.check_output("-")


def test_same_file_as_input(tmp_path):
    src = tmp_path / "in.png"
    iio.write_image(src, sample_image("uint8", 3))
    spellings = [src, tmp_path / "sub" / ".." / "in.png", tmp_path / "link.png"]
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.png").symlink_to(src)
    for out in spellings:
        with pytest.raises(OutputError, match="would overwrite the input") as err:
            iio.check_output(out, input_path=src)
        assert "overwrite=True" in str(err.value) and str(src) in str(err.value)
        assert "--force" in err.value.cli_message
    assert iio.check_output(src, input_path=src, overwrite=True) == src
    other = tmp_path / "other.png"
    assert iio.check_output(other, input_path=src) == other


def test_overwriting_the_input_with_overwrite(tmp_path):
    src = tmp_path / "in.png"
    iio.write_image(src, sample_image("uint8", 3))
    img = iio.read_image(src)
    out = iio.check_output(src, input_path=src, overwrite=True, dtype=img.dtype, channels=3)
    iio.write_image(out, 255 - img, overwrite=True)
    np.testing.assert_array_equal(iio.read_image(src), 255 - img)


def test_writing_through_a_symlink_keeps_the_link(tmp_path):
    real = tmp_path / "real.png"
    iio.write_image(real, sample_image("uint8", 1))
    link = tmp_path / "link.png"
    link.symlink_to(real)
    img = sample_image("uint8", 1, seed=9)
    iio.write_image(link, img, overwrite=True)
    assert link.is_symlink()
    np.testing.assert_array_equal(iio.read_image(real), img)


# ---------------------------------------------------------------------------------------
# Atomic writes


@pytest.fixture
def existing(tmp_path):
    out = tmp_path / "o.png"
    out.write_bytes(b"old contents")
    return out


def assert_untouched(existing: Path):
    assert existing.read_bytes() == b"old contents"
    assert sorted(p.name for p in existing.parent.iterdir()) == ["o.png"]


def test_failed_rename_leaves_target_and_no_temp(existing, monkeypatch):
    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OutputError, match="No space left"):
        iio.write_image(existing, sample_image("uint8", 3), overwrite=True)
    assert_untouched(existing)


def test_failed_fsync_leaves_target_and_no_temp(existing, monkeypatch):
    def fail(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OutputError, match="Input/output error"):
        iio.write_image(existing, sample_image("uint8", 3), overwrite=True)
    assert_untouched(existing)


def test_failed_encode_leaves_target(existing, monkeypatch):
    monkeypatch.setattr(cv2, "imencode", lambda *a, **k: (False, None))
    with pytest.raises(OutputError, match="could not encode"):
        iio.write_image(existing, sample_image("uint8", 3), overwrite=True)
    assert_untouched(existing)


def test_interrupted_write_leaves_no_temp(existing, monkeypatch):
    def interrupt(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        iio.write_image(existing, sample_image("uint8", 3), overwrite=True)
    assert_untouched(existing)


def test_temp_file_is_beside_the_target_and_renamed(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((Path(src), Path(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    out = tmp_path / "o.tiff"
    out.write_bytes(b"old")
    iio.write_image(out, sample_image("float32", 3), overwrite=True)
    [(src, dst)] = seen
    assert src.parent == tmp_path and dst == out and src != out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.tiff"]


def test_file_appearing_during_write_is_not_clobbered(tmp_path, monkeypatch):
    out = tmp_path / "o.png"
    real_fsync = os.fsync

    def racing_writer(fd):
        real_fsync(fd)
        if not out.exists():
            out.write_bytes(b"someone else's")

    monkeypatch.setattr(os, "fsync", racing_writer)
    with pytest.raises(OutputError, match="exists"):
        iio.write_image(out, sample_image("uint8", 3))
    assert out.read_bytes() == b"someone else's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.png"]


def test_new_file_mode_follows_umask_and_overwrite_keeps_mode(tmp_path):
    old = os.umask(0o027)
    try:
        out = iio.write_image(tmp_path / "n.png", sample_image("uint8", 1))
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    out.chmod(0o604)
    iio.write_image(out, sample_image("uint8", 1, seed=2), overwrite=True)
    assert stat.S_IMODE(out.stat().st_mode) == 0o604


# ---------------------------------------------------------------------------------------
# Samples and import cost


# The photos; samples/classify/ holds the classification example (docs/classify.md).
SAMPLE_FILES = sorted(p for p in SAMPLES.iterdir() if p.is_file() and p.suffix != ".md")


def test_samples_exist_and_are_small():
    assert 3 <= len(SAMPLE_FILES) <= 5
    sizes = [p.stat().st_size for p in SAMPLE_FILES]
    assert max(sizes) < 200_000 and sum(sizes) < 1_000_000


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=[p.name for p in SAMPLE_FILES])
def test_sample_reads_like_opencv_and_is_documented(path):
    img = iio.read_image(path)
    np.testing.assert_array_equal(img, cv2.imread(str(path), cv2.IMREAD_UNCHANGED))
    assert min(img.shape[:2]) >= 200 and img.flags.c_contiguous
    assert f"`{path.name}`" in (SAMPLES / "README.md").read_text()


def test_samples_cover_color_gray_and_16_bit():
    kinds = {(iio.read_image(p).ndim, iio.read_image(p).dtype.name) for p in SAMPLE_FILES}
    assert {(3, "uint8"), (2, "uint8"), (2, "uint16")} <= kinds
    assert iio.read_image(SAMPLES / "astronaut.jpg").shape == (512, 512, 3)


def test_importing_io_loads_no_heavy_modules():
    code = (
        "import sys, imgfilter.io; "
        "print(sorted(m for m in ('cv2', 'PIL', 'numba') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------
# Issue 25: frames, quality, metadata, leaving at once


def _save_frames(path: Path, n: int, **kw) -> Path:
    ims = [Image.fromarray(np.full((8, 10, 3), 50 * i, np.uint8)) for i in range(n)]
    ims[0].save(path, save_all=True, append_images=ims[1:], **kw)
    return path


@pytest.mark.parametrize(
    ("name", "kw", "what"),
    [("a.gif", {}, "frames"), ("a.tif", {}, "pages"), ("a.png", {}, "frames"),
     ("a.webp", {"lossless": True}, "frames")],
)  # fmt: skip
def test_several_frames_warn_and_read_the_first(tmp_path, name, kw, what):
    path = _save_frames(tmp_path / name, 3, **kw)
    with pytest.warns(iio.MultiFrameWarning, match=f"has 3 {what}; reading the first"):
        img = iio.read_image(path)
    assert img.shape[:2] == (8, 10) and int(img[..., :3].max()) == 0  # the first frame


@pytest.mark.parametrize("name", ["one.gif", "one.tif", "one.png", "one.webp"])
def test_one_frame_does_not_warn(tmp_path, name, recwarn):
    Image.fromarray(np.zeros((8, 10, 3), np.uint8)).save(tmp_path / name)
    iio.read_image(tmp_path / name)
    assert not [w for w in recwarn if issubclass(w.category, iio.MultiFrameWarning)]


def test_quality_jpeg_and_lossy_webp(tmp_path):
    img = sample_image("uint8", 3, 64, 64)
    small = iio.write_image(tmp_path / "q5.jpg", img, quality=5)
    big = iio.write_image(tmp_path / "q100.jpg", img, quality=100)
    assert small.stat().st_size < big.stat().st_size
    lossy = iio.write_image(tmp_path / "q60.webp", img, quality=60)
    assert lossy.read_bytes()[12:16] == b"VP8 "
    assert iio.write_image(tmp_path / "q0.webp", img, quality=0).read_bytes()[12:16] == b"VP8 "


@pytest.mark.parametrize(
    ("name", "quality", "words"),
    [("o.jpg", 101, "0 to 100"), ("o.jpg", -1, "0 to 100"), ("o.jpg", 9.5, "integer"),
     ("o.jpg", True, "integer"), ("o.png", 90, "JPEG and WebP"), ("o.tif", 90, "not TIFF")],
)  # fmt: skip
def test_bad_quality_is_a_usage_error(tmp_path, name, quality, words):
    from imgfilter.errors import UsageError

    with pytest.raises(UsageError, match=words) as info:
        iio.write_image(tmp_path / name, sample_image("uint8", 3), quality=quality)
    assert "--quality" not in str(info.value)  # API words; the CLI's are in cli_message
    with pytest.raises(UsageError):
        iio.check_output(tmp_path / name, quality=quality)
    assert not (tmp_path / name).exists()


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "maker"
    exif[0x0112] = orientation
    return exif.tobytes()


@pytest.mark.parametrize("src_ext", [".jpg", ".png", ".webp"])
@pytest.mark.parametrize(("out_ext", "channels"), [(".jpg", 3), (".png", 4), (".webp", 3),
                                                   (".webp", 4), (".jpg", 1)])  # fmt: skip
def test_metadata_round_trip(tmp_path, src_ext, out_ext, channels):
    icc = bytes(range(256)) * 300  # > 64 KiB: several JPEG APP2 segments
    src = tmp_path / f"in{src_ext}"
    Image.fromarray(sample_image("uint8", 3)[..., ::-1]).save(src, exif=_exif(8), icc_profile=icc)
    meta = iio.read_metadata(src)
    assert meta.icc == icc and meta.exif and io_pillow.exif_orientation(meta.exif) == 8
    out = iio.write_image(tmp_path / f"out{out_ext}", sample_image("uint8", channels),
                          metadata=meta)  # fmt: skip
    with Image.open(out) as im:
        im.load()
        assert im.info.get("icc_profile") == icc
        assert im.getexif().get(0x010F) == "maker" and im.getexif().get(0x0112) == 1
    if out_ext != ".jpg":  # lossless: the pixels are the same with and without metadata
        plain = iio.write_image(tmp_path / f"plain{out_ext}", sample_image("uint8", channels))
        np.testing.assert_array_equal(iio.read_image(out), iio.read_image(plain))


def test_metadata_of_a_plain_file_is_empty_and_changes_nothing(tmp_path):
    src = tmp_path / "in.png"
    cv2.imwrite(str(src), sample_image("uint8", 3))
    meta = iio.read_metadata(src)
    assert not meta and meta.exif is None and meta.icc is None
    a = iio.write_image(tmp_path / "a.png", sample_image("uint8", 3), metadata=meta)
    b = iio.write_image(tmp_path / "b.png", sample_image("uint8", 3))
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("ext", [".jpg", ".png", ".webp", ".tif"])
def test_metadata_of_a_file_is_read_in_place(tmp_path, monkeypatch, ext):
    """A file's metadata comes from its header, as Pillow parses it: the image is not
    decoded nor its data checked (a raster's pixels would be read twice), with the same
    EXIF and ICC."""
    icc = bytes(range(256)) * 40
    src = tmp_path / f"in{ext}"
    Image.fromarray(sample_image("uint8", 3)[..., ::-1]).save(src, exif=_exif(6), icc_profile=icc)

    def refuse(*args, **kwargs):
        raise AssertionError("the whole file was read")

    monkeypatch.setattr(io_read, "read_frames", refuse)
    monkeypatch.setattr(io_read, "zlib", types.SimpleNamespace(crc32=refuse))  # nor checked
    meta = iio.read_metadata(src)
    assert meta.icc == icc
    if ext == ".tif":
        assert meta.exif is None  # a TIFF's EXIF is not carried over (see read_metadata)
    else:
        assert meta.exif and io_pillow.exif_orientation(meta.exif) == 6


def test_metadata_of_missing_empty_and_piped_files(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        iio.read_metadata(tmp_path / "none.jpg")
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(InputError, match="empty"):
        iio.read_metadata(tmp_path / "empty.jpg")
    if not hasattr(os, "mkfifo"):
        return
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)  # no writer: opening it to read would wait for one
    got = {}

    def metadata() -> None:
        try:
            iio.read_metadata(fifo)
        except InputError as e:
            got["error"] = str(e)

    reader = threading.Thread(target=metadata, daemon=True)
    reader.start()
    reader.join(20)
    assert "not a regular file" in got.get("error", ""), "read_metadata of a FIFO hung"


def test_stage_image_writes_a_temp_file_and_its_commit_puts_it_in_place(tmp_path, monkeypatch):
    """The first half leaves the bytes in a temporary file and nothing at the target; the
    second, on another thread, fsyncs and renames it: the file is then the one that
    write_image writes, and nothing else is left in the folder."""
    img = sample_image("uint8", 3)
    commit = iio.stage_image(tmp_path / "out.jpg", img)
    (tmp,) = tmp_path.iterdir()
    assert tmp.name.startswith(".out.jpg.") and tmp.name.endswith(".tmp")
    synced, real_fsync, done = [], os.fsync, {}
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    worker = threading.Thread(target=lambda: done.update(path=commit()))
    worker.start()
    worker.join()
    assert done["path"] == tmp_path / "out.jpg" and synced
    assert [p.name for p in tmp_path.iterdir()] == ["out.jpg"]
    iio.write_image(tmp_path / "ref.jpg", img)
    assert (tmp_path / "out.jpg").read_bytes() == (tmp_path / "ref.jpg").read_bytes()


def test_a_staged_write_whose_target_appeared_meanwhile_fails_and_cleans_up(tmp_path):
    commit = iio.stage_image(tmp_path / "out.png", sample_image("uint8", 1))
    (tmp_path / "out.png").write_bytes(b"someone else's")
    with pytest.raises(OutputError, match="exists"):
        commit()
    assert (tmp_path / "out.png").read_bytes() == b"someone else's"
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]


def test_a_staged_write_checks_as_write_image_does(tmp_path):
    (tmp_path / "there.png").write_bytes(b"x")
    with pytest.raises(OutputError, match="exists"):
        iio.stage_image(tmp_path / "there.png", sample_image("uint8", 3))
    with pytest.raises(OutputError, match="JPEG holds 8-bit"):
        iio.stage_image(tmp_path / "deep.jpg", sample_image("uint16", 3))
    assert [p.name for p in tmp_path.iterdir()] == ["there.png"]


def test_abandon_io_removes_temp_files_and_refuses_new_writes(tmp_path, monkeypatch):
    """What the CLI does on Ctrl-C while another thread writes: the temporary file goes,
    descriptor 2 is the real stderr again, and no write starts afterwards."""
    monkeypatch.setattr(io_native, "_abandoned", False)
    monkeypatch.setattr(io_native, "_temp_files", set())
    seen = []
    real_fsync = os.fsync

    def abandon_during_write(fd):
        seen.extend(p for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
        real_fsync(fd)
        iio.abandon_io()

    monkeypatch.setattr(os, "fsync", abandon_during_write)
    target = tmp_path / "out.png"
    with pytest.raises(OutputError):
        iio.write_image(target, sample_image("uint8", 3))
    assert seen and not any(p.exists() for p in seen)
    assert not target.exists() and not list(tmp_path.iterdir())
    with pytest.raises(OutputError, match="interrupted"):
        iio.write_image(tmp_path / "later.png", sample_image("uint8", 3))
    assert not list(tmp_path.iterdir())


def test_abandon_io_gives_back_stderr_while_a_decoder_holds_it(monkeypatch, capfd):
    monkeypatch.setattr(io_native, "_abandoned", False)
    monkeypatch.setattr(io_native, "_saved_stderr_fds", [])
    before = os.fstat(2)
    with io_native.quiet_native(cv2):
        assert os.fstat(2).st_ino != before.st_ino  # captured
        iio.abandon_io()
        assert (os.fstat(2).st_dev, os.fstat(2).st_ino) == (before.st_dev, before.st_ino)
        os.write(2, b"seen by the user\n")
    assert "seen by the user" in capfd.readouterr().err
    assert (os.fstat(2).st_dev, os.fstat(2).st_ino) == (before.st_dev, before.st_ino)


def test_one_capture_file_is_kept_and_emptied_between_captures(capfd):
    """The file that descriptor 2 points at while a codec runs is made once; each
    capture sees only what was written since it started, and the file is emptied when
    the last thread leaves it."""
    with io_native.quiet_native(cv2) as first:
        os.write(2, b"first chatter\n")
    sink = io_native._capture_sink
    with io_native.quiet_native(cv2) as outer:
        with io_native.quiet_native(cv2) as inner:
            os.write(2, b"second chatter\n")
        os.write(2, b"third chatter\n")
    assert io_native._capture_sink is sink and os.fstat(sink.fileno()).st_size == 0
    assert first.text == "first chatter\n" and inner.text == "second chatter\n"
    assert outer.text == "second chatter\nthird chatter\n"
    assert "chatter" not in capfd.readouterr().err


def test_read_all_reads_to_the_end_whatever_the_size_it_is_told(tmp_path):
    """The file's bytes in one read; a file longer or shorter than its fstat said (it
    changed meanwhile) is read to its end all the same."""
    data = np.random.default_rng(4).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    for told in (len(data), 1000, 0, len(data) + 5000):
        fd = os.open(path, os.O_RDONLY)
        try:
            assert io_read._read_all(fd, told) == data
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------
# NumPy .npy images


def test_npy_is_memory_mapped_not_read(tmp_path):
    img = sample_image("float32", 3)
    np.save(tmp_path / "a.npy", img)
    back = iio.read_image(tmp_path / "a.npy")
    assert isinstance(back.base, np.memmap) and not back.flags.writeable
    assert back.dtype == np.float32 and back.flags.c_contiguous
    np.testing.assert_array_equal(back, img)


@pytest.mark.parametrize(
    "stored, want",
    [
        (np.asfortranarray(sample_image("uint16", 3)), None),  # Fortran order
        (sample_image("float32", 4).astype(">f4"), None),  # big-endian
        (sample_image("uint8", 1)[:, :, None], None),  # (H, W, 1) -> (H, W)
        (np.arange(12, dtype=np.int64).reshape(3, 4) * 1000, np.uint16),  # fits uint16
        (np.eye(3, dtype=bool), np.uint8),  # 0 / 255
    ],
    ids=["fortran", "big-endian", "one-channel", "int64", "bool"],
)
def test_npy_other_layouts_and_dtypes_are_converted_losslessly(tmp_path, stored, want):
    np.save(tmp_path / "a.npy", stored)
    back = iio.read_image(tmp_path / "a.npy")
    assert back.flags.c_contiguous and back.dtype.isnative
    expected = stored[:, :, 0] if stored.ndim == 3 and stored.shape[2] == 1 else stored
    if stored.dtype == bool:
        expected = expected.astype(np.uint8) * 255
    assert back.dtype == (want or stored.dtype.newbyteorder("="))
    np.testing.assert_array_equal(back, expected)


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda p: p.write_bytes(b"\x93NUMPY\x01\x00garbage"), "not a valid .npy file"),
        (lambda p: np.save(p, np.array([1, "a"], dtype=object)), "not a valid .npy file"),
        (lambda p: np.save(p, np.zeros((3, 4, 5), np.uint8)), "unsupported image layout"),
        (lambda p: np.save(p, np.zeros((0, 4), np.uint8)), "the array is empty"),
        (lambda p: np.save(p, np.full((2, 2), 70000, np.int32)), "do not fit uint8 or uint16"),
    ],
    ids=["header", "objects", "layout", "empty", "range"],
)
def test_npy_problems_are_one_line_input_errors(tmp_path, make, words):
    path = tmp_path / "bad.npy"
    make(path)
    with pytest.raises(InputError, match=words) as err:
        iio.read_image(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_npy_output_is_written_atomically_and_keeps_the_array(tmp_path):
    img = sample_image("uint16", 4)
    target = tmp_path / "out.npy"
    target.write_bytes(b"old")
    with pytest.raises(OutputError, match="exists"):
        iio.write_image(target, img)
    assert target.read_bytes() == b"old"
    iio.write_image(target, img, overwrite=True)
    np.testing.assert_array_equal(np.load(target), img)
    assert not list(tmp_path.glob("*.tmp"))
    assert iio.default_output(target, "blur").name == "out.blur.npy"
    assert iio.read_metadata(target) == iio.ImageMetadata(exif=None, icc=None)


@pytest.mark.parametrize("shape,dtype", [((37, 5), np.float32), ((3, 301, 4), np.uint16),
                                         ((1, 7, 3), np.uint8)])  # fmt: skip
def test_write_npy_from_fills_a_map_of_the_new_file(tmp_path, shape, dtype):
    """fill() is given a memory map of a temporary file beside the target (not an
    array in memory); what it writes is the .npy's data, and only a complete file
    appears at the target."""
    want = np.random.default_rng(9).integers(0, 200, shape).astype(dtype)
    target = tmp_path / "r.npy"
    seen = []

    def fill(array):
        assert isinstance(array, np.memmap) and array.flags.writeable
        assert not target.exists()
        (temp,) = tmp_path.glob(".r.npy.*.tmp")
        array[...] = want
        array.flush()
        np.testing.assert_array_equal(np.load(temp), want)  # written through to the file
        seen.append(array.shape)

    assert iio.write_npy_from(target, shape, dtype, fill) == target
    assert seen == [shape]
    got = np.load(target)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)
    assert not list(tmp_path.glob(".*.tmp"))


def test_write_npy_from_refuses_and_cleans_up(tmp_path):
    target = tmp_path / "r.npy"
    target.write_bytes(b"old")

    def fill(array):
        array[...] = 1

    with pytest.raises(OutputError, match="exists"):
        iio.write_npy_from(target, (4, 5), np.uint8, fill)
    with pytest.raises(OutputError, match=".npy files only"):
        iio.write_npy_from(tmp_path / "r.png", (4, 5), np.uint8, fill)
    with pytest.raises(OutputError, match="non-empty"):
        iio.write_npy_from(tmp_path / "e.npy", (0, 5), np.uint8, fill)
    with pytest.raises(OutputError, match="int64"):
        iio.write_npy_from(tmp_path / "d.npy", (4, 5), np.int64, fill)

    def broken(array):
        array[:2] = 7
        raise RuntimeError("the filter failed")

    with pytest.raises(RuntimeError, match="the filter failed"):
        iio.write_npy_from(target, (4, 5), np.uint8, broken, overwrite=True)
    assert target.read_bytes() == b"old"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["r.npy"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_fifo_or_a_device_is_refused_at_once_exit_3(tmp_path):
    """Issue 57, section 4, item 4: a FIFO with no writer hung the command forever;
    anything that is not a regular file is now a one-line error (exit 3)."""
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    run = subprocess.run(
        [sys.executable, "-m", "imgfilter", "blur", str(fifo), "--k", "3", "-o",
         str(tmp_path / "out.png")], capture_output=True, text=True, timeout=60,
        cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 3, run
    assert run.stderr.count("\n") == 1 and "not a regular file" in run.stderr, run.stderr
    assert not (tmp_path / "out.png").exists()
    for path in (fifo, Path("/dev/zero")):
        assert_input_error(path, "not a regular file")


def test_a_png_bomb_is_refused_from_its_header(tmp_path):
    """Issue 57, section 4, item 3: a 74-byte PNG whose header claims 60000x60000 RGB
    took 6-9.5 s and 3.6 GB before its exit 3; its IDAT data cannot hold that image."""
    raw = bytes(1 + 3 * 8) * 8  # 8 rows of 8 black RGB pixels, each with its filter byte
    ihdr = struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    bomb = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9))
    bomb += chunk(b"IEND", b"")
    path = tmp_path / "bomb.png"
    path.write_bytes(bomb)
    assert len(bomb) < 100
    code = (
        "import sys, time\n"
        "import imgfilter\n"
        "t = time.perf_counter()\n"
        "try:\n"
        f"    imgfilter.read_image({str(path)!r})\n"
        "except imgfilter.InputError as e:\n"
        "    print(e)\n"
        "print(time.perf_counter() - t)\n"
        # VmHWM is this program's peak; ru_maxrss would also count the forking test
        # process's (Linux keeps the larger across exec).
        "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=REPO)  # fmt: skip
    message, seconds, max_rss_kib = run.stdout.splitlines()
    assert "60000x60000" in message and str(path) in message, run
    assert float(seconds) < 2.0  # was 6-9.5 s; 0.5 s unloaded (0.57 s seen under CI's load)
    assert int(max_rss_kib) < 400 << 10  # no image-sized allocation (the image: 10.8 GB)
    cli = subprocess.run(
        [sys.executable, "-m", "imgfilter", "blur", str(path), "--k", "3", "-o",
         str(tmp_path / "out.png")], capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert cli.returncode == 3 and cli.stderr.count("\n") == 1, cli


@pytest.mark.parametrize("ext", [".jpg", ".png", ".webp"])
def test_an_exif_block_pillow_cannot_parse_is_carried_as_it_is(tmp_path, ext):
    """Orientation cannot be reset in it (nor read from it): its bytes go out unchanged,
    and nothing is printed or raised."""
    exif = b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", 40) + bytes(7)  # 40 entries cut
    meta = iio.ImageMetadata(exif=exif, icc=None)
    out = iio.write_image(tmp_path / f"out{ext}", sample_image("uint8", 3), metadata=meta)
    assert exif in out.read_bytes()
    assert io_pillow.exif_orientation(exif) is None


def test_the_most_compressed_pngs_are_not_taken_for_bombs(tmp_path):
    """Deflate's own limit (about 1032:1) bounds the check: flat images at the highest
    compression, by OpenCV and by Pillow, 8-bit and 1-bit, come close and still read."""
    flat = np.zeros((3000, 4000), np.uint8)
    ok, buf = cv2.imencode(".png", flat, [cv2.IMWRITE_PNG_COMPRESSION, 9])
    (tmp_path / "cv.png").write_bytes(buf.tobytes())
    Image.fromarray(flat).save(tmp_path / "pil.png", optimize=True)
    Image.fromarray(flat.astype(bool)).save(tmp_path / "bits.png", optimize=True)
    for name in ("cv.png", "pil.png", "bits.png"):
        path = tmp_path / name
        pixel_bytes = flat.size // 8 if name == "bits.png" else flat.size
        assert path.stat().st_size * 900 < pixel_bytes  # within 15% of deflate's limit
        np.testing.assert_array_equal(iio.read_image(path), flat)
