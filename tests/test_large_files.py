"""Image files past what OpenCV decodes from memory: decoded from their path, with the
same checks, orientation, frame notes and results; OpenCV's pixel limit raised."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import cv2
import numpy as np
import pytest
from PIL import Image

import imgfilter
from imgfilter import io as iio
from imgfilter import io_pillow, io_read, tiff


def image(shape: tuple, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)


def smooth(h: int, w: int) -> np.ndarray:
    """A colour gradient (JPEG keeps it close), not square so that rotations show."""
    y, x = np.mgrid[0:h, 0:w]
    return np.dstack([x * 5 % 256, y * 7 % 256, (x + y) * 3 % 256]).astype(np.uint8)


def exif(orientation: int) -> bytes:
    data = Image.Exif()
    data[0x0112] = orientation
    return data.tobytes()


@pytest.fixture
def imread_calls(monkeypatch):
    """The paths cv2.imread decodes."""
    calls = []
    real = cv2.imread
    monkeypatch.setattr(cv2, "imread", lambda path, *a: calls.append(path) or real(path, *a))
    return calls


def write_sample(folder, kind: str):
    """A file of each kind read through the path: (path, what read_image gives)."""
    if kind == "jpeg":  # rotated by its EXIF orientation
        path = folder / "o6.jpg"
        Image.fromarray(smooth(24, 40)).save(path, exif=exif(6))
        return path, cv2.imread(str(path), cv2.IMREAD_COLOR)
    if kind == "png":  # 16-bit with alpha
        img = image((24, 40, 4), np.uint16, seed=1)
        path = folder / "a.png"
        assert cv2.imwrite(str(path), img)
        return path, img
    if kind == "tiff":
        img = image((41, 23, 3), np.uint16, seed=2)
        path = folder / "c.tif"
        assert cv2.imwrite(str(path), img)
        return path, img
    if kind == "bigtiff":
        img = image((41, 23, 3), np.uint8, seed=3)
        path = folder / "b.tif"
        with open(path, "wb") as f:
            tiff.write(f, img)
        return path, img
    img = image((17, 9, 3), np.uint8, seed=4)
    path = folder / "x.bmp"
    assert cv2.imwrite(str(path), img)
    return path, img


@pytest.mark.parametrize("kind", ("jpeg", "png", "tiff", "bigtiff", "bmp"))
def test_large_files_are_decoded_from_their_path_with_the_same_result(
    tmp_path, monkeypatch, imread_calls, kind
):
    path, expected = write_sample(tmp_path, kind)
    imread_calls.clear()  # the sample's own reference read
    usual = imgfilter.read_image(path)
    assert imread_calls == []  # below DECODE_FROM_PATH_BYTES: from the file's bytes
    monkeypatch.setattr(io_read, "DECODE_FROM_PATH_BYTES", 1)
    through_path = imgfilter.read_image(path)
    if kind in ("tiff", "bigtiff"):  # strips: tiff.read, from the open file
        assert imread_calls == []
        np.testing.assert_array_equal(through_path, usual)
        monkeypatch.setattr(tiff, "read", lambda *a, **k: None)  # a layout it leaves
        through_path = imgfilter.read_image(path)
    assert imread_calls == [str(path)]
    np.testing.assert_array_equal(through_path, usual)
    np.testing.assert_array_equal(through_path, expected)
    assert through_path.flags.c_contiguous


def test_a_large_png_keeps_its_exif_orientation(tmp_path, monkeypatch, imread_calls):
    rgb = smooth(24, 40)
    path = tmp_path / "o8.png"
    Image.fromarray(rgb).save(path, exif=exif(8))
    monkeypatch.setattr(io_read, "DECODE_FROM_PATH_BYTES", 1)
    img = imgfilter.read_image(path)
    assert imread_calls == [str(path)]
    np.testing.assert_array_equal(img, np.rot90(rgb, 1)[..., ::-1])


def test_a_large_npy_stays_memory_mapped(tmp_path, monkeypatch, imread_calls):
    img = image((30, 20, 3), np.uint8, seed=5)
    path = tmp_path / "a.npy"
    np.save(path, img)
    monkeypatch.setattr(io_read, "DECODE_FROM_PATH_BYTES", 1)
    back = imgfilter.read_image(path)
    assert imread_calls == []
    assert isinstance(back, np.memmap) or isinstance(back.base, np.memmap)
    np.testing.assert_array_equal(back, img)


def test_a_large_tiffs_pages_are_counted(tmp_path, monkeypatch):
    pages = [image((9, 12), np.uint8, seed=s) for s in range(3)]
    path = tmp_path / "pages.tif"
    assert cv2.imwritemulti(str(path), pages)
    monkeypatch.setattr(io_read, "DECODE_FROM_PATH_BYTES", 1)
    with pytest.warns(iio.MultiFrameWarning, match="has 3 pages; reading the first"):
        np.testing.assert_array_equal(imgfilter.read_image(path), pages[0])


def test_damaged_large_files_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(io_read, "DECODE_FROM_PATH_BYTES", 1)
    bad_tiff = tmp_path / "bad.tif"
    bad_tiff.write_bytes(b"II*\0" + b"\xff" * 60)
    with pytest.raises(imgfilter.InputError, match=r"bad\.tif: OpenCV could not decode this TIFF"):
        imgfilter.read_image(bad_tiff)
    cut = tmp_path / "cut.jpg"
    Image.fromarray(smooth(64, 64)).save(cut)
    cut.write_bytes(cut.read_bytes()[:-300])  # checked from its bytes, as any JPEG
    with pytest.raises(imgfilter.InputError, match=r"^cannot read .*cut\.jpg: "):
        imgfilter.read_image(cut)


def _tiff(width: int, height: int) -> bytes:
    """A gray 8-bit TIFF header claiming width x height, with one strip of one row (a
    PNG so short would be refused sooner: its data cannot hold so many pixels)."""
    tags = [(256, 4, width), (257, 4, height), (258, 3, 8), (259, 3, 1), (262, 3, 1),
            (273, 4, 8 + 2 + 12 * 8 + 4), (277, 3, 1), (278, 4, 1), (279, 4, width)]  # fmt: skip
    ifd = struct.pack("<H", len(tags)) + b"".join(
        struct.pack("<HHI", tag, kind, 1) + struct.pack("<I" if kind == 4 else "<HH", value,
                                                        *([0] if kind == 3 else []))
        for tag, kind, value in tags
    )  # fmt: skip
    return b"II*\0" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + bytes(width)


@pytest.mark.parametrize("first", ("imgfilter", "cv2"))
def test_an_image_past_opencvs_pixel_limit_says_what_to_do(tmp_path, first):
    """10**12 pixels, past any host's memory: refused in one line. With cv2 imported
    before imgfilter reads, OpenCV keeps its own limit: the line says to set the
    variable first; otherwise it names the variable's value."""
    path = tmp_path / "huge.tif"
    path.write_bytes(_tiff(1_000_000, 1_000_000))
    imports = "import cv2, imgfilter" if first == "cv2" else "import imgfilter"
    code = (f"{imports}\n"
            f"try:\n    imgfilter.read_image({str(path)!r})\n"
            "except imgfilter.InputError as e:\n    print(e)\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_IO_MAX_IMAGE_PIXELS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith(f"cannot read {path}: it has more pixels than OpenCV decodes")
    if first == "cv2":
        assert "cv2 was loaded before imgfilter first read an image" in line
    else:
        assert "OPENCV_IO_MAX_IMAGE_PIXELS=" in line


def test_a_first_read_raises_opencvs_pixel_limit_and_import_writes_no_environment(tmp_path):
    """`import imgfilter` changes no environment variable; imgfilter's first read sets
    OpenCV's limit to the host's memory before cv2 loads, unless the user set it."""
    sample = str(tmp_path / "small.png")
    imgfilter.write_image(sample, np.full((4, 5, 3), 7, np.uint8))
    show = "print(os.environ.get('OPENCV_IO_MAX_IMAGE_PIXELS'))"
    code = f"import os, imgfilter; {show}\nimgfilter.read_image({sample!r}); {show}"
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_IO_MAX_IMAGE_PIXELS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split()
    assert before == "None" and int(after) >= 1 << 30
    env["OPENCV_IO_MAX_IMAGE_PIXELS"] = "12345"  # the user's setting stays
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.stdout.split() == ["12345", "12345"]


@pytest.fixture
def small_pillow_limit(monkeypatch):
    """A function that makes Pillow refuse images of more than 1000 pixels (its
    MAX_IMAGE_PIXELS 500), as it refuses a 14000x13000 scene by default; OpenCV's (and
    imgfilter's) limit as usual. Called once the test's files are written (older Pillow
    checks the limit when it writes a GIF, too)."""
    yield lambda: monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)
    assert Image.MAX_IMAGE_PIXELS == 500  # put back after every open


def test_metadata_past_pillows_pixel_limit_is_kept(tmp_path, small_pillow_limit, monkeypatch):
    icc = bytes(range(256)) * 3
    src = tmp_path / "scene.png"
    Image.fromarray(image((40, 40, 3), np.uint8, 1)).save(src, icc_profile=icc)
    small_pillow_limit()
    with pytest.raises(Image.DecompressionBombError):  # what Pillow alone does
        Image.open(src)
    assert iio.read_metadata(src).icc == icc
    monkeypatch.setenv("OPENCV_IO_MAX_IMAGE_PIXELS", "100")  # never below Pillow's own
    assert iio.read_metadata(src).icc is None


def test_frames_and_pillow_decodes_past_pillows_pixel_limit(tmp_path, small_pillow_limit):
    frames = [Image.fromarray(np.full((40, 40, 3), 60 * i, np.uint8)) for i in range(2)]
    src = tmp_path / "scene.gif"
    frames[0].save(src, save_all=True, append_images=frames[1:])
    small_pillow_limit()
    with pytest.warns(iio.MultiFrameWarning, match="has 2 frames"):
        iio.read_image(src)
    img = io_pillow.decode(src.read_bytes(), src, "gif", "")  # OpenCV's fallback
    assert img.shape == (40, 40, 3) and not img.any()
