"""imgfilter.tiff.read: TIFFs decoded by tifffile on threads to exactly the pixels
`cv2.imread(path, IMREAD_UNCHANGED)` gives, damaged strips and tiles an error (OpenCV
decodes them to wrong rows), every layout it does not take left to OpenCV (None), and
`imgfilter.read_image` using it. The files are made by tifffile and OpenCV."""

from __future__ import annotations

import io
import warnings

import cv2
import numpy as np
import pytest
import tifffile
from test_tiff import image  # random images with -inf and huge values

import imgfilter
from imgfilter import io_read, tiff
from imgfilter.errors import InputError

DTYPES = (np.uint8, np.uint16, np.float32)
SHAPES = ((37, 53), (37, 53, 3), (37, 53, 4), (1, 61, 3), (29, 1), (1, 1))


def opencv(path) -> np.ndarray:
    return cv2.imread(str(path), cv2.IMREAD_UNCHANGED)


def read(path, threads: int | None = None):
    """tiff.read of the open file, checked against tiff.read of its bytes."""
    with open(path, "rb") as f:
        from_file = tiff.read(f, threads=threads)
    from_bytes = tiff.read(path.read_bytes(), threads=threads)
    if from_file is None:
        assert from_bytes is None
    else:
        np.testing.assert_array_equal(from_bytes, from_file)
    return from_file


def file_order(img: np.ndarray) -> np.ndarray:
    """Samples in a TIFF's order (RGB(A)) from an OpenCV image."""
    return img if img.ndim == 2 else img[:, :, [2, 1, 0, 3][: img.shape[2]]]


def tifffile_write(path, img: np.ndarray, **kw) -> None:
    """`img` (OpenCV's order) written by tifffile as OpenCV's reader takes it: RGB, a
    fourth channel an unspecified extra sample."""
    channels = 1 if img.ndim == 2 else img.shape[2]
    kw.setdefault("photometric", "rgb" if channels >= 3 else "minisblack")
    if channels == 4:
        kw.setdefault("extrasamples", (0,))
    tifffile.imwrite(path, file_order(img), metadata=None, **kw)


def blocks(path) -> tuple[list[int], list[int]]:
    """(offsets, byte counts) of the first page's strips or tiles."""
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        return list(page.dataoffsets), list(page.databytecounts)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_the_bigtiffs_imgfilter_writes(tmp_path, monkeypatch, dtype, shape):
    monkeypatch.setattr(tiff, "STRIP_BYTES", 100)  # many strips, the last one short
    img = image(shape, dtype, seed=sum(shape))
    path = tmp_path / "a.tif"
    with open(path, "wb") as f:
        tiff.write(f, img)
    got = read(path)
    assert got is not None and got.dtype == img.dtype and got.flags.c_contiguous
    np.testing.assert_array_equal(got, opencv(path))
    np.testing.assert_array_equal(got, img)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("compression", (1, 5, 8))
def test_opencvs_uncompressed_lzw_and_deflate_tiffs(tmp_path, dtype, shape, compression):
    img = image(shape, dtype, seed=7 + sum(shape))
    path = tmp_path / "cv.tif"
    assert cv2.imwrite(str(path), img, [cv2.IMWRITE_TIFF_COMPRESSION, compression])
    got = read(path)
    if got is None:
        # OpenCV 5 differences LZW and Deflate floats (predictor 3), which read leaves
        # to it; OpenCV 4.8 does not, and read takes its files
        assert dtype == np.float32 and compression in (5, 8)
        with tifffile.TiffFile(path) as tif:
            assert tif.pages[0].predictor == 3  # Predictor: floating point
        return
    np.testing.assert_array_equal(got, opencv(path))
    np.testing.assert_array_equal(got, img)


LAYOUTS = [  # (dtype, channels)
    (np.uint8, 3), (np.uint16, 3), (np.uint16, 1), (np.float32, 3), (np.uint8, 4),
    (np.float32, 4),
]  # fmt: skip


@pytest.mark.parametrize("byteorder", ("<", ">"))
@pytest.mark.parametrize("compression", (None, "lzw", "zlib"))
@pytest.mark.parametrize(("dtype", "channels"), LAYOUTS)
@pytest.mark.parametrize("blocks_kw", ({"rowsperstrip": 5}, {"tile": (16, 16)},
                                       {"tile": (32, 48), "bigtiff": True}))  # fmt: skip
def test_tifffiles_strips_and_tiles(tmp_path, byteorder, compression, dtype, channels,
                                    blocks_kw):  # fmt: skip
    """Strips (the last one short) or tiles cut at the right and bottom edges, either
    byte order, classic or BigTIFF, integers differenced where compressed."""
    img = image((23, 37, channels) if channels > 1 else (23, 37), dtype, seed=channels)
    predictor = compression is not None and np.dtype(dtype).kind == "u"
    path = tmp_path / "t.tif"
    tifffile_write(path, img, byteorder=byteorder, compression=compression,
                   predictor=predictor, **blocks_kw)  # fmt: skip
    for threads in (1, 3):
        got = read(path, threads=threads)
        assert got is not None and got.flags.c_contiguous and got.dtype == img.dtype
        np.testing.assert_array_equal(got, img)
    np.testing.assert_array_equal(got, opencv(path))


def test_a_cog_like_file_reads_its_full_resolution_image(tmp_path):
    """Tiles and a reduced-resolution copy in a SubIFD, as a cloud-optimised GeoTIFF."""
    img = image((70, 90, 3), np.uint8, seed=11)
    path = tmp_path / "cog.tif"
    with tifffile.TiffWriter(path, bigtiff=True) as w:
        w.write(file_order(img), photometric="rgb", tile=(32, 32), compression="zlib",
                predictor=True, subifds=1, metadata=None)  # fmt: skip
        w.write(file_order(img)[::2, ::2], photometric="rgb", tile=(32, 32),
                compression="zlib", subfiletype=1, metadata=None)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one page: no MultiFrameWarning
        np.testing.assert_array_equal(imgfilter.read_image(path), img)
    np.testing.assert_array_equal(imgfilter.read_image(path), opencv(path))


@pytest.mark.parametrize(
    "kw",
    [
        {"extratags": [(274, "H", 1, 3, True)]},  # rotated 180 degrees
        {"photometric": "miniswhite", "dtype": np.uint8, "channels": 1},
        {"compression": "jpeg"},
        {"compression": "packbits"},
        {"compression": "zlib", "predictor": 3, "dtype": np.float32},  # floating point
        {"planarconfig": "separate"},
        {"extrasamples": (2,), "channels": 4},  # a declared alpha (OpenCV premultiplies)
        {"dtype": np.int16, "channels": 1},
    ],
)
def test_layouts_it_leaves_to_opencv(kw, tmp_path):
    kw = dict(kw)
    dtype, channels = kw.pop("dtype", np.uint8), kw.pop("channels", 3)
    rng = np.random.default_rng(1)
    img = rng.integers(0, 100, (16, 32, channels)[: 2 if channels == 1 else 3]).astype(dtype)
    path = tmp_path / "other.tif"
    tifffile_write(path, img, **kw)
    assert read(path) is None
    expected = opencv(path)
    if expected is None:  # nor Pillow: one line
        with pytest.raises(InputError, match="cannot read"):
            imgfilter.read_image(path)
    else:  # OpenCV's pixels (values: its int16 comes back as uint16)
        np.testing.assert_array_equal(imgfilter.read_image(path), expected)


@pytest.mark.parametrize("compression", (None, "zlib", "lzw"))
@pytest.mark.parametrize("tile", (None, (16, 32)))
def test_a_file_cut_inside_a_block_is_damaged(tmp_path, compression, tile):
    img = image((40, 70, 3), np.uint16, seed=5)
    path = tmp_path / "cut.tif"
    tifffile_write(path, img, compression=compression, tile=tile, rowsperstrip=3)
    offsets, counts = blocks(path)
    last = int(np.argmax(offsets))  # the block stored last
    data = path.read_bytes()
    path.write_bytes(data[: offsets[last] + counts[last] // 2])
    what = "tile" if tile else "strip"
    says = rf"the file ends at byte \d+, inside {what} {last + 1} of {len(offsets)}"
    for threads in (1, 8):
        with pytest.raises(tiff.DamagedTiff, match=says):
            read(path, threads)


@pytest.mark.parametrize("compression", ("zlib", "lzw"))
@pytest.mark.parametrize("tile", (None, (16, 32)))
def test_a_damaged_block_is_an_error_not_wrong_rows(tmp_path, compression, tile):
    """A Deflate stream's checksum catches any change; an LZW stream with a code
    outside its table is refused too."""
    img = image((40, 70, 3), np.uint8, seed=6)
    path = tmp_path / "bad.tif"
    tifffile_write(path, img, compression=compression, predictor=True, tile=tile,
                   rowsperstrip=7)  # fmt: skip
    offsets, counts = blocks(path)
    data = bytearray(path.read_bytes())
    at = offsets[2] + counts[2] // 2
    data[at : at + 8] = bytes(b ^ 0x5A for b in data[at : at + 8])
    path.write_bytes(bytes(data))
    what = "tile" if tile else "strip"
    for threads in (1, 8):
        with pytest.raises(tiff.DamagedTiff, match=rf"a {what} of {len(offsets)} does not decode"):
            read(path, threads)


@pytest.mark.parametrize(("compression", "keep", "says"),
                         [(None, 3, "does not decode"), ("lzw", 3, "does not decode"),
                          ("zlib", 0, "strip at row 16, column 0 is empty")])  # fmt: skip
def test_a_block_shorter_than_its_rows_is_damaged(tmp_path, compression, keep, says):
    """A strip whose byte count is short of its rows (uncompressed, LZW cut short), or
    none at all (tifffile alone would fill it with zeros)."""
    img = image((47, 13, 3), np.uint16, seed=3)
    path = tmp_path / "short.tif"
    tifffile_write(path, img, compression=compression, rowsperstrip=4)
    with tifffile.TiffFile(path) as tif:
        tag = tif.pages[0].tags[279]  # StripByteCounts
        fmt = tif.byteorder + {3: "u2", 4: "u4", 16: "u8"}[int(tag.dtype)]
        at, counts = tag.valueoffset, list(tag.value)
    counts[4] = counts[4] // 3 if keep else 0
    packed = np.array(counts, fmt).tobytes()
    data = bytearray(path.read_bytes())
    data[at : at + len(packed)] = packed
    path.write_bytes(bytes(data))
    with pytest.raises(tiff.DamagedTiff, match=says):
        read(path)


def test_old_style_lzw_is_left_to_opencv(tmp_path):
    """LZW strips of TIFF before 5.0 (libtiff: a first byte 0, a second one odd)."""
    img = image((10, 12, 3), np.uint8, seed=2)
    path = tmp_path / "old.tif"
    tifffile_write(path, img, compression="lzw")
    offsets, _ = blocks(path)
    data = bytearray(path.read_bytes())
    data[offsets[0] : offsets[0] + 2] = b"\0\x01"
    path.write_bytes(bytes(data))
    assert read(path) is None


def test_past_opencvs_pixel_limit_it_leaves_the_file_to_opencv(tmp_path, monkeypatch):
    """OpenCV refuses such a file with a message naming its limit (imgfilter.io turns it
    into one line); `read` allocates nothing for it."""
    path = tmp_path / "many.tif"
    tifffile_write(path, image((23, 19, 3), np.uint8, seed=5), compression="zlib")
    assert read(path) is not None
    monkeypatch.setenv("OPENCV_IO_MAX_IMAGE_PIXELS", str(23 * 19 - 1))
    assert read(path) is None


def test_what_is_not_a_tiff_is_left_to_opencv():
    assert tiff.read(b"not a tiff at all") is None
    assert tiff.read(b"II*\0" + bytes(4)) is None


def test_read_image_takes_it_for_every_tiff_threads_for_large_ones(tmp_path, monkeypatch):
    img = image((40, 30, 3), np.uint8, seed=9)
    path = tmp_path / "big.tif"
    tifffile_write(path, img, compression="lzw", predictor=True, rowsperstrip=7)
    calls = []
    real = tiff.read

    def spy(source, threads=None):
        got = real(source, threads=threads)
        calls.append((threads, isinstance(source, io.BufferedReader) and got is not None))
        return got

    monkeypatch.setattr(tiff, "read", spy)
    np.testing.assert_array_equal(imgfilter.read_image(path), img)
    assert calls == [(1, True)]  # taken, below TIFF_THREADS_MIN_BYTES: on the calling thread
    monkeypatch.setattr(io_read, "TIFF_THREADS_MIN_BYTES", 0)
    np.testing.assert_array_equal(imgfilter.read_image(path), img)
    assert calls[-1] == (None, True)  # a pool of threads, from the open file
    monkeypatch.setattr(io_read, "DECODE_FROM_PATH_BYTES", 0)  # the large files' path
    np.testing.assert_array_equal(imgfilter.read_image(path), img)
    assert calls[-1] == (None, True)


def test_a_damaged_tiff_is_a_one_line_error_exit_3(tmp_path, monkeypatch):
    """OpenCV decodes a TIFF whose Deflate strip is broken to an image with those rows
    wrong (it only logs the error); read_image and the CLI say the file is damaged."""
    import subprocess
    import sys

    img = image((60, 30, 3), np.uint8, seed=9)
    path = tmp_path / "bad.tif"
    tifffile_write(path, img, compression="zlib", predictor=True, rowsperstrip=7)
    data = path.read_bytes()
    offsets, counts = blocks(path)
    broken = bytearray(data)
    broken[offsets[3] + 4 : offsets[3] + 34] = bytes(30)
    for damaged in (bytes(broken), data[: offsets[-1] + 3]):  # a broken stream, cut short
        path.write_bytes(damaged)
        for decode_from_path in (1 << 30, 0):
            monkeypatch.setattr(io_read, "DECODE_FROM_PATH_BYTES", decode_from_path)
            with pytest.raises(InputError, match="damaged TIFF") as e:
                imgfilter.read_image(path)
            assert str(path) in str(e.value) and "\n" not in str(e.value)
    command = [sys.executable, "-m", "imgfilter", "blur", str(path), "--k", "3", "-o",
               str(tmp_path / "o.tif")]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True)
    assert run.returncode == 3, run
    assert run.stderr.count("\n") == 1 and "damaged TIFF" in run.stderr, run.stderr
