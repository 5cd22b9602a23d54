"""imgfilter.tiff: BigTIFF outputs (what OpenCV reads back is what was written) and
large TIFF inputs (decoded from their path, their pages counted)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import imgfilter
from imgfilter import tiff


def image(shape: tuple, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        img = (rng.standard_normal(shape) * 1e3).astype(dtype)
        img.flat[0], img.flat[-1] = -np.inf, 3e38  # huge values and -inf survive
        return img
    return rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)


@pytest.fixture
def small_strips(monkeypatch):
    """Strips of a few rows and every TIFF written as BigTIFF, so small images take the
    path of large ones (many strips, a row count no strip size divides)."""
    monkeypatch.setattr(tiff, "STRIP_BYTES", 100)
    monkeypatch.setattr(tiff, "BIGTIFF_MIN_BYTES", 1)


@pytest.mark.parametrize("dtype", (np.uint8, np.uint16, np.float32))
@pytest.mark.parametrize("shape", ((37, 53), (37, 53, 3), (37, 53, 4), (1, 61, 3), (29, 1), (1, 1)))
def test_what_opencv_reads_back_is_what_was_written(tmp_path, small_strips, dtype, shape):
    img = image(shape, dtype, seed=sum(shape))
    before = img.copy()
    path = imgfilter.write_image(tmp_path / "out.tif", img)
    assert path.read_bytes()[:8] == b"II+\0\x08\0\0\0"  # BigTIFF, 8-byte offsets
    back = imgfilter.read_image(path)
    assert back.dtype == img.dtype
    np.testing.assert_array_equal(back, img)
    np.testing.assert_array_equal(img, before)  # the strips are differenced in copies


def test_one_channel_images_and_threads(tmp_path, small_strips):
    img = image((45, 17, 1), np.uint16, seed=3)
    for threads in (1, 4):
        path = tmp_path / f"t{threads}.tif"
        with open(path, "wb") as f:
            tiff.write(f, img[:, :, 0], threads=threads)
        np.testing.assert_array_equal(imgfilter.read_image(path), img[:, :, 0])
    assert (tmp_path / "t1.tif").read_bytes() == (tmp_path / "t4.tif").read_bytes()


def test_smooth_images_are_compressed(tmp_path, small_strips):
    y, x = np.mgrid[0:200, 0:300]
    img = np.stack([(x + y) % 256, (2 * x) % 256, np.full_like(x, 7)], axis=2).astype(np.uint8)
    path = imgfilter.write_image(tmp_path / "smooth.tif", img)
    assert path.stat().st_size < img.nbytes / 4
    np.testing.assert_array_equal(imgfilter.read_image(path), img)


def test_the_directory_names_every_strip(tmp_path, small_strips):
    img = image((23, 10, 3), np.uint8, seed=4)  # 30 bytes a row: 3 rows a strip, 8 strips
    path = imgfilter.write_image(tmp_path / "d.tif", img)
    data = path.read_bytes()
    (ifd,) = struct.unpack_from("<Q", data, 8)
    (n,) = struct.unpack_from("<Q", data, ifd)
    tags = {}
    for i in range(n):
        tag, kind, count, value = struct.unpack_from("<HHQ8s", data, ifd + 8 + 20 * i)
        tags[tag] = (kind, count, value)
    assert list(tags) == sorted(tags)
    assert struct.unpack("<I", tags[278][2][:4])[0] == 3  # RowsPerStrip
    assert tags[273][1] == tags[279][1] == 8  # StripOffsets, StripByteCounts
    assert struct.unpack("<H", tags[259][2][:2])[0] == 8  # Deflate


def test_below_the_threshold_opencv_writes_classic_tiff(tmp_path):
    img = image((20, 30, 3), np.uint8, seed=5)
    path = imgfilter.write_image(tmp_path / "c.tif", img)
    assert path.read_bytes()[:4] == b"II*\0"  # classic TIFF (OpenCV's LZW)
    np.testing.assert_array_equal(imgfilter.read_image(path), img)


@pytest.fixture
def read_from_path(monkeypatch):
    """Every TIFF file counts as large: decoded from its path, pages counted here."""
    monkeypatch.setattr(tiff, "READ_FROM_PATH_BYTES", 1)


@pytest.mark.parametrize("big", (False, True))
def test_large_tiffs_are_decoded_from_their_path_as_any_tiff(tmp_path, monkeypatch, big):
    import cv2

    img = image((41, 23, 3), np.uint16, seed=6)
    path = tmp_path / "in.tif"
    if big:
        with open(path, "wb") as f:
            tiff.write(f, img)
    else:
        assert cv2.imwrite(str(path), img)
    decoded = []
    real_imread = cv2.imread
    monkeypatch.setattr(cv2, "imread", lambda *a: decoded.append(a[0]) or real_imread(*a))
    np.testing.assert_array_equal(imgfilter.read_image(path), img)
    assert decoded == []  # below READ_FROM_PATH_BYTES: from the file's bytes
    monkeypatch.setattr(tiff, "READ_FROM_PATH_BYTES", 1)
    np.testing.assert_array_equal(imgfilter.read_image(path), img)
    assert decoded == [str(path)]


def test_a_large_tiffs_pages_are_counted(tmp_path, read_from_path):
    import cv2

    pages = [image((9, 12), np.uint8, seed=s) for s in range(3)]
    path = tmp_path / "pages.tif"
    assert cv2.imwritemulti(str(path), pages)
    with pytest.warns(imgfilter.io.MultiFrameWarning, match="has 3 pages; reading the first"):
        np.testing.assert_array_equal(imgfilter.read_image(path), pages[0])
    with open(path, "rb") as f:
        assert tiff.page_count(f) == 3


def test_page_count_of_bigtiff_and_of_what_is_not_tiff(tmp_path):
    path = tmp_path / "one.tif"
    with open(path, "wb") as f:
        tiff.write(f, image((5, 6, 4), np.uint8, seed=7))
    with open(path, "rb") as f:
        assert tiff.page_count(f) == 1
    other = tmp_path / "x.bin"
    other.write_bytes(b"not a tiff at all")
    with open(other, "rb") as f:
        assert tiff.page_count(f) == 1


def test_a_corrupt_large_tiff_is_one_line(tmp_path, read_from_path):
    path = tmp_path / "bad.tif"
    path.write_bytes(b"II*\0" + b"\xff" * 60)
    with pytest.raises(imgfilter.InputError, match=r"^cannot read .*bad\.tif: OpenCV could not"):
        imgfilter.read_image(path)


def _png(width: int, height: int) -> bytes:
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit gray
    idat = zlib.compress(b"\0" * (width + 1))  # one row; the rest missing
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def test_an_image_past_opencvs_pixel_limit_names_the_limit(tmp_path):
    path = tmp_path / "huge.png"
    path.write_bytes(_png(1_000_000, 1_000_000))  # 10**12 pixels: past any host's memory
    with pytest.raises(imgfilter.InputError, match="OPENCV_IO_MAX_IMAGE_PIXELS"):
        imgfilter.read_image(path)


def test_importing_imgfilter_raises_opencvs_pixel_limit_to_the_hosts_memory():
    import os
    import subprocess
    import sys

    code = "import os, imgfilter; print(os.environ['OPENCV_IO_MAX_IMAGE_PIXELS'])"
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_IO_MAX_IMAGE_PIXELS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 1 << 30
    env["OPENCV_IO_MAX_IMAGE_PIXELS"] = "12345"  # the user's setting stays
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.stdout.strip() == "12345"
