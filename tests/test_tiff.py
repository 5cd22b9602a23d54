"""imgfilter.tiff: BigTIFF outputs (what OpenCV reads back is what was written) and
the pages of a TIFF counted."""

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
