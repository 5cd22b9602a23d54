"""imgfilter.headers: the decoded size of PNG, JPEG and TIFF files from their headers,
checked against what imgfilter.io reads; None for anything else."""

from __future__ import annotations

import io as bytes_io
import os
import threading

import cv2
import numpy as np
import pytest
import tifffile
from PIL import Image

from imgfilter import headers, io, tiff


def _random(shape, dtype=np.uint8, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)


def _check(path):
    assert headers.decoded_bytes(path) == io.read_image(path).nbytes


@pytest.mark.parametrize("shape", [(37, 53), (1, 517), (300, 1), (29, 31, 3), (1, 1, 3)])
@pytest.mark.parametrize("ext", [".png", ".jpg", ".tiff"])
def test_opencv_files(tmp_path, shape, ext):
    path = tmp_path / f"a{ext}"
    cv2.imwrite(str(path), _random(shape))
    _check(path)


@pytest.mark.parametrize(("shape", "dtype"), [((41, 23), np.uint16), ((17, 19, 3), np.uint16),
                                              ((13, 11, 4), np.uint8)])  # fmt: skip
def test_png_depths_and_alpha(tmp_path, shape, dtype):
    path = tmp_path / "a.png"
    cv2.imwrite(str(path), _random(shape, dtype))
    _check(path)


@pytest.mark.parametrize("mode", ["P", "LA", "1", "I;16"])
def test_pillow_pngs(tmp_path, mode):
    path = tmp_path / "a.png"
    if mode == "I;16":
        Image.fromarray(_random((21, 34), np.uint16)).save(path)
    else:
        Image.fromarray(_random((21, 34, 3))).convert(mode).save(path)
    _check(path)


@pytest.mark.parametrize(
    "options",
    [{}, {"progressive": True}, {"exif": Image.Exif()}, {"icc_profile": bytes(200_000)},
     {"quality": 10, "subsampling": 2}],
)  # fmt: skip
@pytest.mark.parametrize("mode", ["RGB", "L", "CMYK"])
def test_pillow_jpegs(tmp_path, mode, options):
    """Frame headers after APPn segments (EXIF, an ICC profile in several APP2
    segments), progressive (SOF2) frames, CMYK (read as 3 channels)."""
    path = tmp_path / "a.jpg"
    Image.fromarray(_random((45, 67, 3))).convert(mode).save(path, **options)
    _check(path)


def test_jpeg_fill_bytes_before_a_marker(tmp_path):
    buf = bytes_io.BytesIO()
    Image.fromarray(_random((33, 44, 3))).save(buf, "JPEG")
    data = buf.getvalue()
    padded = data[:2] + b"\xff\xff\xff" + data[2:]  # fill bytes are allowed before any marker
    (tmp_path / "a.jpg").write_bytes(padded)
    assert headers.decoded_bytes(tmp_path / "a.jpg") == 33 * 44 * 3


TIFF_CASES = [((23, 45, 3), np.uint8), ((31, 7), np.uint16), ((9, 14, 3), np.float32),
              ((1, 300, 4), np.uint8)]  # fmt: skip


@pytest.mark.parametrize(("shape", "dtype"), TIFF_CASES)
def test_imgfilter_tiffs(tmp_path, shape, dtype):
    path = tmp_path / "a.tiff"
    with open(path, "wb") as f:
        tiff.write(f, _random(shape, dtype))
    _check(path)


@pytest.mark.parametrize("order", ["<", ">"])
def test_either_byte_order(tmp_path, order):
    path = tmp_path / "a.tiff"
    tifffile.imwrite(path, _random((19, 28, 3), np.uint16), byteorder=order, photometric="rgb",
                     rowsperstrip=5)  # fmt: skip
    _check(path)


def test_sizes_far_past_the_file(tmp_path):
    """The header's word is taken: a 40000x30000 PNG header on a tiny file."""
    path = tmp_path / "a.png"
    cv2.imwrite(str(path), _random((5, 6, 3)))
    data = bytearray(path.read_bytes())
    data[16:24] = (40000).to_bytes(4, "big") + (30000).to_bytes(4, "big")
    path.write_bytes(bytes(data))
    assert headers.decoded_bytes(path) == 40000 * 30000 * 3


def _jpeg_bytes():
    buf = bytes_io.BytesIO()
    Image.fromarray(_random((16, 24, 3))).save(buf, "JPEG")
    return buf.getvalue()


def _sof_at(data: bytes) -> int:
    return next(i for i in range(2, len(data) - 1) if data[i] == 0xFF and data[i + 1] == 0xC0)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not an image at all",
        b"BM" + bytes(60),  # BMP: not parsed
        b"\x89PNG\r\n\x1a\n" + bytes(4) + b"IEND" + bytes(10),  # no IHDR first
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00",  # cut in IHDR
        b"\xff\xd8\xff\xd9",  # SOI then EOI: no frame
        _jpeg_bytes()[:30],  # cut before the frame header
        _jpeg_bytes()[:2] + b"\x00" + _jpeg_bytes()[2:],  # not a marker where one must be
        b"II*\x00" + (10**6).to_bytes(4, "little") + bytes(8),  # directory past the end
        b"MM\x00*" + bytes(4),  # directory at 0: its count read as the header
    ],
)
def test_unparsable_headers_give_none(tmp_path, content):
    path = tmp_path / "x.img"
    path.write_bytes(content)
    assert headers.decoded_bytes(path) is None


def test_jpeg_whose_height_comes_later(tmp_path):
    data = bytearray(_jpeg_bytes())
    at = _sof_at(bytes(data))
    data[at + 5 : at + 7] = b"\x00\x00"  # height 0: defined by a DNL segment
    (tmp_path / "a.jpg").write_bytes(bytes(data))
    assert headers.decoded_bytes(tmp_path / "a.jpg") is None


def test_jpeg_scan_before_a_frame_gives_none(tmp_path):
    data = _jpeg_bytes()
    at = _sof_at(data)
    scan = b"\xff\xda\x00\x02"
    (tmp_path / "a.jpg").write_bytes(data[:at] + scan + data[at:])
    assert headers.decoded_bytes(tmp_path / "a.jpg") is None


def test_missing_file_and_directory(tmp_path):
    assert headers.decoded_bytes(tmp_path / "missing.png") is None
    assert headers.decoded_bytes(tmp_path) is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_fifo_gives_none_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "a.png"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(headers.decoded_bytes(fifo)), daemon=True)
    reader.start()
    reader.join(20)
    assert got == [None], "decoded_bytes waited for a writer"
