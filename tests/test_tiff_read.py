"""imgfilter.tiff.read: TIFFs in strips decoded on threads to exactly the pixels
`cv2.imread(path, IMREAD_UNCHANGED)` gives, every layout it does not take left to
OpenCV (None), and `imgfilter.read_image` using it for large TIFFs.

`pip install` builds its C helper (`imgfilter/_tiff_strips.c`) into the installed
package; the tests import the tree's `imgfilter`, so where no built copy sits in the
tree they build one into a temporary folder (skipped without a C compiler)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import cv2
import extensions
import numpy as np
import pytest
from test_tiff import image  # random images with -inf and huge values

import imgfilter
from imgfilter import io as imgio
from imgfilter import tiff
from imgfilter.errors import InputError

SOURCE = Path(tiff.__file__).with_name("_tiff_strips.c")
DTYPES = (np.uint8, np.uint16, np.float32)


@pytest.fixture(scope="module")
def helper(tmp_path_factory):
    """The built C helper (built here if need be)."""
    if tiff._tiff_strips is not None:
        return tiff._tiff_strips
    return extensions.build("_tiff_strips", SOURCE, tmp_path_factory.mktemp("tiff_strips"))


@pytest.fixture(autouse=True)
def with_helper(helper, monkeypatch):
    monkeypatch.setattr(tiff, "_tiff_strips", helper)


SHAPES = ((37, 53), (37, 53, 3), (37, 53, 4), (1, 61, 3), (29, 1), (1, 1))


def opencv(path) -> np.ndarray:
    return cv2.imread(str(path), cv2.IMREAD_UNCHANGED)


def read(path, threads: int | None = None):
    with open(path, "rb") as f:
        from_file = tiff.read(f, threads=threads)
    from_bytes = tiff.read(path.read_bytes(), threads=threads)
    if from_file is None:
        assert from_bytes is None
    else:
        np.testing.assert_array_equal(from_bytes, from_file)
    return from_file


def lzw(data: bytes) -> bytes:
    """TIFF LZW as libtiff's encoder writes it, written out here as the reference the
    decoder must invert: codes most significant bit first, 256 first, the width raised
    once the next free entry passes 2**width - 1, a clear code when the table is full
    (the next free entry 4094), 257 last."""
    out, acc, nbits, width = bytearray(), 0, 0, 9

    def put(code: int) -> None:
        nonlocal acc, nbits
        acc, nbits = (acc << width) | code, nbits + width
        while nbits >= 8:
            nbits -= 8
            out.append((acc >> nbits) & 0xFF)
        acc &= (1 << nbits) - 1

    def added() -> None:  # after each new entry
        nonlocal free, width, table
        free += 1
        if free == 4094:
            put(256)
            table, free, width = {bytes([i]): i for i in range(256)}, 258, 9
        elif free > (1 << width) - 1:
            width += 1

    table, free = {bytes([i]): i for i in range(256)}, 258
    put(256)
    w = b""
    for byte in data:
        wc = w + bytes([byte])
        if wc in table:
            w = wc
            continue
        put(table[w])
        table[wc] = free
        added()
        w = bytes([byte])
    if w:
        put(table[w])
        added()
    put(257)
    if nbits:
        out.append((acc << (8 - nbits)) & 0xFF)
    return bytes(out)


def _blocks(samples: np.ndarray, rows: int, tile: tuple[int, int] | None) -> list[np.ndarray]:
    """Strips of `rows` rows, or (th, tw) tiles row by row, each padded past the image's
    right and bottom edges with samples that are not the image's."""
    h, w, s = samples.shape
    if tile is None:
        return [samples[start : start + rows] for start in range(0, h, rows)]
    th, tw = tile
    junk = np.random.default_rng(7).integers(0, 200, (th, tw, s)).astype(samples.dtype)
    blocks = []
    for y in range(0, h, th):
        for x in range(0, w, tw):
            block = junk.copy()
            part = samples[y : y + th, x : x + tw]
            block[: part.shape[0], : part.shape[1]] = part
            blocks.append(block)
    return blocks


def handmade(samples: np.ndarray, order: str = "<", compression: int = 1, predictor: int = 1,
             rows: int = 5, tags: dict | None = None,
             tile: tuple[int, int] | None = None) -> bytes:  # fmt: skip
    """A classic TIFF of `samples` ((H, W, S) in the file's sample order) in strips of
    `rows` rows or in (length, width) tiles, written here field by field (either byte
    order, any extra `tags`: {tag: (type, values)} overriding the defaults)."""
    h, w, s = samples.shape
    dt = samples.dtype.newbyteorder(order)
    strips = []
    for block in _blocks(samples, rows, tile):
        part = block.copy()
        if predictor == 2:  # within each row of the block
            part[:, 1:] -= block[:, :-1]
        raw = part.astype(dt).tobytes()
        strips.append({8: zlib.compress, 5: lzw}.get(compression, bytes)(raw))
    kind = 3 if samples.dtype.kind == "f" else 1
    fields = {256: (4, [w]), 257: (4, [h]), 258: (3, [samples.itemsize * 8] * s),
              259: (3, [compression]), 262: (3, [2 if s >= 3 else 1]), 277: (3, [s]),
              278: (4, [rows]), 284: (3, [1]), 317: (3, [predictor]),
              339: (3, [kind] * s), 273: (4, [0] * len(strips)),
              279: (4, [len(b) for b in strips])}  # fmt: skip
    if tile is not None:  # the tiles' fields in place of the strips'
        for tag in (273, 278, 279):
            del fields[tag]
        fields.update({322: (4, [tile[1]]), 323: (4, [tile[0]]), 324: (4, [0] * len(strips)),
                       325: (4, [len(b) for b in strips])})  # fmt: skip
    fields.update(tags or {})
    size = {3: "H", 4: "I"}
    n = len(fields)
    ifd_size = 2 + 12 * n + 4
    arrays = b""
    arrays_at = 8 + ifd_size
    layout = {}
    for tag, (t, values) in sorted(fields.items()):
        packed = struct.pack(order + size[t] * len(values), *values)
        if len(packed) > 4:
            layout[tag] = arrays_at + len(arrays)
            arrays += packed + b"\0" * (len(packed) % 2)
    data_at = arrays_at + len(arrays)
    offsets, at = [], data_at
    for b in strips:
        offsets.append(at)
        at += len(b)
    fields[273 if tile is None else 324] = (4, offsets)
    arrays = b""
    entries = b""
    for tag, (t, values) in sorted(fields.items()):
        packed = struct.pack(order + size[t] * len(values), *values)
        if len(packed) > 4:
            arrays += packed + b"\0" * (len(packed) % 2)
            value = struct.pack(order + "I", layout[tag])
        else:
            value = packed.ljust(4, b"\0")
        entries += struct.pack(order + "HHI", tag, t, len(values)) + value
    head = (b"II" if order == "<" else b"MM") + struct.pack(order + "HI", 42, 8)
    ifd = struct.pack(order + "H", n) + entries + struct.pack(order + "I", 0)
    return head + ifd + arrays + b"".join(strips)


def file_order(img: np.ndarray) -> np.ndarray:
    """(H, W, S) samples in a TIFF's order (RGB(A)) from an OpenCV image."""
    if img.ndim == 2:
        return img[:, :, None]
    return img[:, :, [2, 1, 0, 3][: img.shape[2]]]


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
        with open(path, "rb") as f:
            tags = tiff._tags(f, f.read(16), path.stat().st_size)
        assert tags[317][0] == 3  # Predictor: floating point
        return
    np.testing.assert_array_equal(got, opencv(path))


@pytest.mark.parametrize("order", ("<", ">"))
@pytest.mark.parametrize("compression", (1, 5, 8))
@pytest.mark.parametrize(("dtype", "channels", "predictor"),
                         [(np.uint8, 3, 2), (np.uint16, 3, 2), (np.uint16, 1, 1),
                          (np.float32, 3, 1), (np.uint8, 4, 2), (np.uint16, 4, 1)])  # fmt: skip
def test_either_byte_order_and_short_last_strips(tmp_path, order, compression, dtype,
                                                 channels, predictor):  # fmt: skip
    img = image((23, 19, channels), dtype, seed=channels)
    tags = {338: (3, [0])} if channels == 4 else {}
    path = tmp_path / "hand.tif"
    path.write_bytes(handmade(img, order, compression, predictor, rows=5, tags=tags))
    got = read(path, threads=3)
    assert got is not None
    np.testing.assert_array_equal(got, opencv(path))
    if predictor == 2 and compression == 1:
        return  # libtiff ignores a predictor on uncompressed strips, as read does
    expected = img[:, :, [2, 1, 0, 3][:channels]] if channels > 1 else img[:, :, 0]
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("compression", "predictor"), [(1, 1), (5, 2), (8, 2), (8, 1)])
@pytest.mark.parametrize(("order", "tile"), [("<", (16, 16)), (">", (32, 48))])
def test_tiled_tiffs(tmp_path, dtype, shape, compression, predictor, order, tile):
    """Tiles row by row, those past the right and bottom edges padded with other
    samples (cropped away), differencing within each tile's rows, either byte order."""
    img = image(shape, dtype, seed=3 + sum(shape))
    if dtype == np.float32:
        predictor = 1  # horizontal differencing is for integers
    channels = 1 if img.ndim == 2 else img.shape[2]
    tags = {338: (3, [0])} if channels == 4 else {}
    path = tmp_path / "tiled.tif"
    path.write_bytes(handmade(file_order(img), order, compression, predictor, tags=tags,
                              tile=tile))  # fmt: skip
    for threads in (1, None):
        got = read(path, threads=threads)
        assert got is not None
        np.testing.assert_array_equal(got, img)
    np.testing.assert_array_equal(got, opencv(path))


def test_damaged_tiles(tmp_path):
    img = image((40, 70, 3), np.uint8, seed=5)
    data = bytearray(handmade(file_order(img), "<", 8, 2, tile=(16, 32)))
    path = tmp_path / "cut.tif"
    path.write_bytes(bytes(data[:-10]))  # the last tile cut short
    with pytest.raises(tiff.DamagedTiff, match=r"tile 9 of 9"):
        read(path)
    tiles = handmade(file_order(img), "<", 8, 2, tile=(16, 32))
    at = len(tiles) - 200  # inside a Deflate stream: its checksum fails
    broken = tiles[:at] + bytes(b ^ 0x5A for b in tiles[at : at + 8]) + tiles[at + 8 :]
    path.write_bytes(broken)
    with pytest.raises(tiff.DamagedTiff, match=r"tile \d of 9"):
        read(path)


@pytest.mark.parametrize(
    "tags",
    [
        {322: (3, [16]), 323: (3, [16])},  # tile sizes beside strips, no tile offsets
        {274: (3, [3])},  # rotated 180 degrees
        {262: (3, [0])},  # white is zero
        {259: (3, [7])},  # JPEG
        {317: (3, [3])},  # floating-point predictor
        {284: (3, [2])},  # separate planes
        {338: (3, [2])},  # a declared alpha (OpenCV's 8-bit reader premultiplies)
        {339: (3, [2, 2, 2, 2])},  # signed integers
        {258: (3, [8, 8, 16, 8])},  # mixed sample sizes
        {278: (4, [4])},  # rows per strip that do not match the strips
    ],
)
def test_layouts_it_leaves_to_opencv(tags, tmp_path):
    img = image((10, 12, 4), np.uint8, seed=1)
    path = tmp_path / "other.tif"
    path.write_bytes(handmade(img, "<", 1, 1, rows=5, tags={338: (3, [0]), **tags}))
    assert read(path) is None


def test_threads_and_damage(tmp_path):
    img = image((200, 31, 3), np.uint16, seed=4)
    data = handmade(img, ">", 8, 2, rows=3)
    path = tmp_path / "d.tif"
    path.write_bytes(data)
    one, many = read(path, threads=1), read(path, threads=8)
    np.testing.assert_array_equal(one, many)
    np.testing.assert_array_equal(one, opencv(path))
    cut, broken = data[:-40], bytearray(data)
    broken[len(data) // 2 : len(data) // 2 + 50] = bytes(50)
    for damaged, says in ((cut, "the file ends at byte"), (broken, "strip")):
        path.write_bytes(damaged)
        with open(path, "rb") as f:
            with pytest.raises(tiff.DamagedTiff, match=says):
                tiff.read(f)
        with pytest.raises(tiff.DamagedTiff, match=says):
            tiff.read(bytes(damaged))
    assert tiff.read(b"not a tiff at all") is None
    assert tiff.read(b"II*\0" + bytes(4)) is None


def test_lzw_tables_that_fill_and_clear(tmp_path):
    """Random samples in one strip: the table fills and clears many times, the codes
    reach 12 bits; a libtiff-written file (Pillow's) too."""
    from PIL import Image

    rng = np.random.default_rng(12)
    img = rng.integers(0, 256, (120, 301, 3), dtype=np.uint8)
    path = tmp_path / "lzw.tif"
    path.write_bytes(handmade(img, "<", 5, 1, rows=120))
    got = read(path, threads=2)
    np.testing.assert_array_equal(got, img[:, :, ::-1])
    np.testing.assert_array_equal(got, opencv(path))
    Image.fromarray(img).save(path, compression="tiff_lzw")
    np.testing.assert_array_equal(read(path), opencv(path))


def test_damaged_lzw_strips(tmp_path, helper):
    img = image((40, 31, 3), np.uint8, seed=6)
    good = lzw(img[:5].tobytes())
    size = 5 * 31 * 3
    assert helper.lzw(good, size) == img[:5].tobytes()
    assert helper.lzw(good, size - 7) == img[:5].tobytes()[: size - 7]  # the rest dropped
    half = helper.lzw(good[: len(good) // 2], size)  # the stream ends early: what came
    assert 0 < len(half) < size and half == img[:5].tobytes()[: len(half)]
    with pytest.raises(ValueError, match="outside the table"):
        helper.lzw(bytes([0x80, 0x00, 0x7F, 0xF0]), size)  # 256, 0, then code 511
    with pytest.raises(ValueError, match="before any string"):
        helper.lzw(bytes([0x80, 0x60, 0x20]), size)  # 256, then code 384
    with pytest.raises(ValueError):
        helper.lzw(good, -1)
    data = bytearray(handmade(img, "<", 5, 2, rows=5))
    path = tmp_path / "bad.tif"
    first = data.index(lzw((img[:5] - np.pad(img[:5], ((0, 0), (1, 0), (0, 0)))[:, :-1])
                           .tobytes())[:12])  # fmt: skip
    broken = bytearray(data)
    broken[first + 1 : first + 3] = b"\xff\xff"  # a code past the table
    cut = handmade(img, "<", 5, 2, rows=5, tags={279: (4, [len(good) // 3] * 8)})
    for damaged, says in ((broken, "strip 1 of 8"), (cut, "strip 1 of 8 holds")):
        path.write_bytes(bytes(damaged))
        with pytest.raises(tiff.DamagedTiff, match=says):
            read(path)


def test_old_style_lzw_is_left_to_opencv(tmp_path):
    """LZW strips of TIFF before 5.0 (libtiff: a first byte 0, a second one odd)."""
    img = image((10, 12, 3), np.uint8, seed=2)
    data = bytearray(handmade(img, "<", 5, 1, rows=10))
    start = data.index(lzw(img.tobytes()))
    data[start : start + 2] = b"\0\x01"
    path = tmp_path / "old.tif"
    path.write_bytes(bytes(data))
    assert read(path) is None


def test_past_opencvs_pixel_limit_it_leaves_the_file_to_opencv(tmp_path, monkeypatch):
    """OpenCV refuses such a file with a message naming its limit (imgfilter.io turns it
    into one line); `read` allocates nothing for it."""
    img = image((23, 19, 3), np.uint8, seed=5)
    path = tmp_path / "many.tif"
    path.write_bytes(handmade(img, "<", 8, 2, rows=4))
    assert read(path) is not None
    monkeypatch.setenv("OPENCV_IO_MAX_IMAGE_PIXELS", str(23 * 19 - 1))
    assert read(path) is None


def test_read_image_takes_it_for_every_tiff_threads_for_large_ones(tmp_path, monkeypatch):
    img = image((40, 30, 3), np.uint8, seed=9)
    path = tmp_path / "big.tif"
    path.write_bytes(handmade(file_order(img), "<", 5, 2, rows=7))
    calls = []
    real = tiff.read
    monkeypatch.setattr(tiff, "read", lambda *a, **k: calls.append(k["threads"]) or real(*a, **k))
    np.testing.assert_array_equal(imgfilter.read_image(path), img)
    assert calls == [1]  # below TIFF_THREADS_MIN_BYTES: on the calling thread
    monkeypatch.setattr(imgio, "TIFF_THREADS_MIN_BYTES", 0)
    np.testing.assert_array_equal(imgfilter.read_image(path), img)
    assert calls == [1, None]  # a pool of threads
    monkeypatch.setattr(imgio, "DECODE_FROM_PATH_BYTES", 0)  # the large files' path
    np.testing.assert_array_equal(imgfilter.read_image(path), img)
    assert calls == [1, None, None]


@pytest.mark.parametrize("threads", (1, 3))
def test_uncompressed_strips_that_follow_each_other_are_read_together(tmp_path, monkeypatch,
                                                                      threads):  # fmt: skip
    img = image((47, 13, 3), np.uint16, seed=3)
    data = handmade(img, ">", 1, 1, rows=4)  # 12 strips, the last of 3 rows
    path = tmp_path / "raw.tif"
    path.write_bytes(data)
    monkeypatch.setattr(tiff, "UNIT_BYTES", 3 * 4 * 13 * 3 * 2)  # three strips a read
    reads = []
    place = tiff._tiff_strips.place
    monkeypatch.setattr(tiff._tiff_strips, "place", lambda dst, *a: reads.append(len(dst))
                        or place(dst, *a))  # fmt: skip
    np.testing.assert_array_equal(read(path, threads), img[:, :, ::-1])
    assert sorted(reads) == sorted([12, 12, 12, 11] * 2)  # from the file, from its bytes
    with open(path, "rb") as f:
        head = f.read(8)
        tags = tiff._tags(f, head + f.read(8), len(data))
    offsets, counts = tags[273].astype(np.int64), tags[279].astype(np.int64)

    def units() -> list[int]:
        return tiff._units(offsets, counts, 4, 47, 13 * 3 * 2, tiff.UNIT_BYTES).tolist()

    assert units() == [3, 0, 0, 3, 0, 0, 3, 0, 0, 3, 0, 0]
    counts[4] -= 2  # a strip short of its rows: read alone (and an error there)
    assert units() == [3, 0, 0, 1, 1, 3, 0, 0, 3, 0, 0, 1]
    offsets[8] += 6  # a strip elsewhere than where the one before it ends
    assert units() == [3, 0, 0, 1, 1, 3, 0, 0, 1, 3, 0, 0]
    short = handmade(img, ">", 1, 1, rows=4, tags={279: (4, [4 * 13 * 6] * 11 + [3 * 13 * 6 - 2])})
    path.write_bytes(short)
    with pytest.raises(tiff.DamagedTiff, match="strip 12 of 12 holds"):
        read(path, threads)


def test_a_damaged_large_tiff_is_a_one_line_error_not_wrong_rows(tmp_path, monkeypatch):
    """OpenCV decodes a TIFF whose Deflate strip is broken to an image with those rows
    wrong (it only logs the error); read_image says the file is damaged."""
    img = image((60, 30, 3), np.uint8, seed=9)
    data = handmade(file_order(img), "<", 8, 2, rows=7)
    broken = bytearray(data)
    broken[len(data) // 2 : len(data) // 2 + 30] = bytes(30)
    path = tmp_path / "bad.tif"
    monkeypatch.setattr(imgio, "TIFF_THREADS_MIN_BYTES", 0)
    for damaged in (bytes(broken), data[: len(data) - 60]):  # a broken stream, cut short
        path.write_bytes(damaged)
        for decode_from_path in (1 << 30, 0):
            monkeypatch.setattr(imgio, "DECODE_FROM_PATH_BYTES", decode_from_path)
            with pytest.raises(InputError, match="damaged TIFF") as e:
                imgfilter.read_image(path)
            assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_without_the_helper_opencv_reads_every_tiff(tmp_path, monkeypatch):
    img = image((40, 30, 3), np.uint8, seed=9)
    path = tmp_path / "big.tif"
    path.write_bytes(handmade(file_order(img), "<", 8, 2, rows=7))
    monkeypatch.setattr(tiff, "_tiff_strips", None)
    assert read(path) is None
    monkeypatch.setattr(imgio, "TIFF_THREADS_MIN_BYTES", 0)
    np.testing.assert_array_equal(imgfilter.read_image(path), img)


def test_the_helper_refuses_what_it_cannot_place(helper):
    src = np.arange(30, dtype=np.uint8)
    dst = np.zeros((2, 5, 3), np.uint8)
    helper.place(dst, src, 5, 3, 1, True, False)
    expected = np.cumsum(src.reshape(2, 5, 3), axis=1, dtype=np.uint8)[:, :, ::-1]
    np.testing.assert_array_equal(dst, expected)
    bad = [  # (width, samples, itemsize, predict)
        (5, 5, 1, False),  # five samples
        (5, 3, 3, False),  # three-byte samples
        (5, 0, 1, False),
        (0, 3, 1, False),
        (5, 3, 4, True),  # floats are never differenced
    ]
    for width, samples, itemsize, predict in bad:
        with pytest.raises(ValueError):
            helper.place(dst, src, width, samples, itemsize, predict, False)
    with pytest.raises(ValueError):  # src shorter than dst
        helper.place(dst, src[:20], 5, 3, 1, False, False)
    with pytest.raises(ValueError):  # dst not whole rows
        helper.place(np.zeros(29, np.uint8), src, 5, 3, 1, False, False)
    with pytest.raises((BufferError, ValueError)):  # dst read-only
        helper.place(np.frombuffer(bytes(30), np.uint8), src, 5, 3, 1, False, False)


@pytest.mark.parametrize(("dtype", "samples"), [(np.uint8, 3), (np.uint8, 1), (np.uint16, 4),
                                                (np.float32, 3)])  # fmt: skip
def test_the_helper_places_a_tile_into_part_of_the_rows(helper, dtype, samples):
    """dst a view of shorter rows further apart (a tile cropped at the image's edge):
    the first pixels of each of src's rows go there, nothing else is written."""
    width, rows = 6, 4
    rng = np.random.default_rng(samples)
    src = rng.integers(0, 250, (rows, width, samples)).astype(dtype)
    image = np.full((7, 9, samples), 77, dtype)
    view = image[2:5, 5:9] if samples > 1 else image[2:5, 5:9, 0]
    predict = dtype != np.float32
    helper.place(view, src, width, samples, np.dtype(dtype).itemsize, predict, False)
    full = np.cumsum(src, axis=1, dtype=dtype) if predict else src
    expected = full[:3, :4, [2, 1, 0, 3][:samples] if samples > 1 else [0]]
    np.testing.assert_array_equal(image[2:5, 5:9], expected)
    outside = np.ones(image.shape[:2], bool)
    outside[2:5, 5:9] = False
    assert (image[outside] == 77).all()


def test_the_helper_refuses_views_it_cannot_fill(helper):
    src = np.arange(60, dtype=np.uint8)
    image = np.zeros((6, 12, 3), np.uint8)
    for view, width in [
        (image[:, ::2], 5),  # pixels not next to each other
        (image[:, :6], 5),  # rows longer than src's
        (image[:, :4, :2], 5),  # two samples where src has three
        (image[:, :4].astype(np.uint16), 5),  # two-byte items for one-byte samples
    ]:
        with pytest.raises(ValueError):
            helper.place(view, src, width, 3, 1, False, False)


def test_read_image_decodes_a_tiff_from_its_file_not_its_bytes(tmp_path, monkeypatch):
    """A TIFF that tiff.read takes is read block by block from the open file (no copy
    of the whole file in memory first); one it does not take is parsed once and read
    as bytes by OpenCV."""
    img = image((30, 50, 3), np.uint8, seed=2)
    tiled = tmp_path / "tiled.tif"
    tiled.write_bytes(handmade(file_order(img), "<", 8, 2, tile=(16, 16)))
    with monkeypatch.context() as m:
        m.setattr(imgio, "_read_bytes", lambda *a, **k: pytest.fail("read whole"))
        np.testing.assert_array_equal(imgfilter.read_image(tiled), img)
    calls = []
    real = tiff.read
    monkeypatch.setattr(tiff, "read", lambda *a, **k: calls.append(1) or real(*a, **k))
    rotated = tmp_path / "rotated.tif"  # an orientation: left to OpenCV
    rotated.write_bytes(handmade(file_order(img), "<", 8, 2, tags={274: (3, [3])}))
    np.testing.assert_array_equal(imgfilter.read_image(rotated), img[::-1, ::-1])
    assert calls == [1]
