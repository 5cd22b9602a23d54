"""TIFF files past what OpenCV's codec handles: BigTIFF output, large TIFF input.

A classic TIFF addresses its data with 32-bit offsets, so it ends at 4 GiB, and
OpenCV writes only classic TIFF: a large scene's result failed after it was filtered.
`write` writes a BigTIFF (64-bit offsets; libtiff, OpenCV, GDAL, tifffile and Pillow
read it) of one image in strips of rows, each compressed with Deflate on a pool of
threads (zlib releases the GIL) and written in order. `imgfilter.io` uses it for TIFF
outputs of BIGTIFF_MIN_BYTES or more.

Layout: the 16-byte header, the strips, then the one image directory (IFD) with its
arrays; the header's pointer to the IFD is written last. Samples are interleaved
(PlanarConfiguration 1) in RGB(A) order, as OpenCV writes TIFF (`cv2.imread` gives
BGR(A) back); integer samples with horizontal differencing (Predictor 2), as OpenCV's
LZW TIFFs, float32 samples without (Predictor 1). A fourth channel is an unspecified
extra sample (ExtraSamples 0), as OpenCV leaves it: libtiff's RGBA reader, which
OpenCV uses for 8-bit images, would multiply the colour by a declared alpha.

Reading: `imgfilter.io` decodes files of 1 GiB or more from their path (OpenCV's
in-memory TIFF reader fails past 4 GiB), counting a TIFF's pages with `page_count`. A
TIFF laid out in strips or tiles, uncompressed, LZW or Deflate, goes through `read`,
which decodes the strips or tiles on a pool of threads (OpenCV decodes on one: 26 s for
a 4.8 GB image on the dev box) and refuses damaged ones (OpenCV returns their rows
wrong); any other layout goes through OpenCV.
"""

from __future__ import annotations

import collections
import io
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from .headers import TIFF_MAGIC, pixel_limit, tiff_fields

try:  # imgfilter/_tiff_strips.c, built by `pip install` where a C compiler is found
    from . import _tiff_strips
except ImportError:
    _tiff_strips = None

# Larger TIFF results go through `write`: OpenCV's LZW can grow incompressible data by
# half, so above this size its classic TIFF could pass 4 GiB.
BIGTIFF_MIN_BYTES = 2 << 30
STRIP_BYTES = 1 << 21  # raw bytes per strip, about: small enough for many threads
DEFLATE_LEVEL = 1  # zlib's fastest: about twice level 6's speed for 20% larger files

_SHORT, _LONG, _LONG8 = 3, 4, 16  # TIFF field types
_DEFLATE = (8, 32946)  # Compression: Deflate (Adobe's code and the old one)
_LZW = 5
UNIT_BYTES = 4 << 20  # uncompressed strips that follow each other: read this much at once
_TILES = (322, 323, 324, 325)  # TileWidth, TileLength, TileOffsets, TileByteCounts
_TAG = struct.Struct("<HHQ8s")  # tag, type, count, value or offset
_FORMATS = {"u": 1, "f": 3}  # SampleFormat: unsigned integer, IEEE float


def write(f: BinaryIO, img: np.ndarray, threads: int | None = None) -> None:
    """Write `img` as a BigTIFF into the open, empty, seekable binary file `f`.

    Args:
        f: The file, positioned at its start.
        img: (H, W) gray or (H, W, 3|4) BGR/BGRA, uint8, uint16 or float32, C-contiguous.
        threads: Compression threads (default: the CPUs).
    """
    h, w = img.shape[:2]
    channels = 1 if img.ndim == 2 else img.shape[2]
    rows = max(1, min(h, STRIP_BYTES // max(1, w * channels * img.itemsize)))
    starts = range(0, h, rows)
    f.write(struct.pack("<2sHHHQ", b"II", 43, 8, 0, 0))  # the IFD's offset comes last
    offsets, counts = [], []
    predict = img.dtype.kind == "u"
    workers = threads or os.cpu_count() or 1
    with ThreadPoolExecutor(workers) as pool:
        pending: collections.deque = collections.deque()  # in order; at most 2 per thread
        for start in starts:
            pending.append(pool.submit(_strip, img[start : start + rows], predict))
            if len(pending) > 2 * workers:
                _put(f, pending.popleft().result(), offsets, counts)
        while pending:
            _put(f, pending.popleft().result(), offsets, counts)
    ifd = f.tell()
    ifd += ifd % 2  # word-aligned
    f.seek(ifd)
    f.write(_directory(ifd, img, channels, rows, offsets, counts))
    f.seek(8)
    f.write(struct.pack("<Q", ifd))
    f.seek(0, os.SEEK_END)


def _strip(rows: np.ndarray, predict: bool) -> bytes:
    """One strip's Deflate stream: RGB(A) order, differenced along rows if `predict`."""
    if rows.ndim == 3 and rows.shape[2] >= 3:
        rows = rows[:, :, [2, 1, 0, 3][: rows.shape[2]]]  # a copy
    elif predict:
        rows = np.array(rows)  # differenced in place below
    if predict:
        # Each sample minus the same sample of the pixel to its left, modulo 2**bits.
        rows[:, 1:] -= rows[:, :-1].copy()
    little = np.ascontiguousarray(rows, dtype=rows.dtype.newbyteorder("<"))  # the file's "II"
    return zlib.compress(little.data, DEFLATE_LEVEL)


def _put(f: BinaryIO, data: bytes, offsets: list, counts: list) -> None:
    offsets.append(f.tell())
    counts.append(len(data))
    f.write(data)


def _directory(at: int, img: np.ndarray, channels: int, rows: int, offsets: list,
               counts: list) -> bytes:  # fmt: skip
    """The image directory written at file offset `at`, its arrays after it."""
    h, w = img.shape[:2]
    bits = img.itemsize * 8
    shorts = {
        258: [bits] * channels,  # BitsPerSample
        259: [8],  # Compression: Deflate
        262: [2 if channels >= 3 else 1],  # Photometric: RGB, or black is zero
        277: [channels],  # SamplesPerPixel
        284: [1],  # PlanarConfiguration: interleaved
        317: [2 if img.dtype.kind == "u" else 1],  # Predictor: horizontal, or none
        339: [_FORMATS[img.dtype.kind]] * channels,  # SampleFormat
    }
    if channels == 4:
        shorts[338] = [0]  # ExtraSamples: unspecified
    longs = {256: [w], 257: [h], 278: [rows]}  # ImageWidth, ImageLength, RowsPerStrip
    long8s = {273: offsets, 279: counts}  # StripOffsets, StripByteCounts
    fields = sorted([(t, _SHORT, "<H", v) for t, v in shorts.items()]
                    + [(t, _LONG, "<I", v) for t, v in longs.items()]
                    + [(t, _LONG8, "<Q", v) for t, v in long8s.items()])  # fmt: skip
    head = 8 + len(fields) * _TAG.size + 8  # entry count, entries, next IFD offset
    entries, extra = [], b""
    for tag, kind, fmt, values in fields:
        packed = b"".join(struct.pack(fmt, v) for v in values)
        if len(packed) <= 8:
            value = packed.ljust(8, b"\0")
        else:  # the array after the directory, word-aligned
            extra += b"\0" * (len(extra) % 2)
            value = struct.pack("<Q", at + head + len(extra))
            extra += packed
        entries.append(_TAG.pack(tag, kind, len(values), value))
    return struct.pack("<Q", len(fields)) + b"".join(entries) + struct.pack("<Q", 0) + extra


def page_count(f: BinaryIO, limit: int = 100_000) -> int:
    """How many images (IFDs) the TIFF or BigTIFF file `f` chains, following each
    directory's pointer to the next (at most `limit`; a loop ends the count); 1 when
    the file is not one."""
    f.seek(0)
    head = f.read(16)
    if head[:4] not in TIFF_MAGIC:
        return 1
    order = "<" if head[:2] == b"II" else ">"
    big = head[2:4] in (b"+\0", b"\0+")
    count_fmt, entry, offset_fmt = ("Q", 20, "Q") if big else ("H", 12, "I")
    (at,) = struct.unpack_from(order + offset_fmt, head, 8 if big else 4)
    seen: set = set()
    while at and at not in seen and len(seen) < limit:
        seen.add(at)
        f.seek(at)
        raw = f.read(struct.calcsize(count_fmt))
        if len(raw) < struct.calcsize(count_fmt):
            break
        (n,) = struct.unpack(order + count_fmt, raw)
        f.seek(at + len(raw) + n * entry)
        raw = f.read(struct.calcsize(offset_fmt))
        if len(raw) < struct.calcsize(offset_fmt):
            break
        (at,) = struct.unpack(order + offset_fmt, raw)
    return max(1, len(seen))


def read(source: BinaryIO | bytes, threads: int | None = None) -> np.ndarray | None:
    """The image of a TIFF or BigTIFF file as `cv2.imread(path, IMREAD_UNCHANGED)`
    gives it, its strips or tiles decoded on a pool of threads (each inflated by zlib or
    decoded from LZW by the C helper `_tiff_strips`, which then puts it in place, a tile
    cut at the image's right and bottom edges); None where this reader does not take the
    file (OpenCV then decodes it, or says what is wrong with it), and for every file
    where the helper is not built.

    Taken: the first directory of a file in strips or tiles (row by row), uncompressed,
    LZW (TIFF 5.0 and later, as libtiff writes it) or Deflate, without
    differencing or with horizontal differencing of integer samples, interleaved
    samples of 8-bit or 16-bit unsigned integers or 32-bit floats, gray (black is zero,
    one sample) or RGB (three, or four with an unspecified fourth, as this module and
    OpenCV write it), no orientation but the default, either byte order. Not taken:
    other compressions (JPEG, PackBits, ...), other sample types or interpretations
    (palette, white is zero, YCbCr, a declared alpha, which OpenCV's 8-bit reader
    premultiplies), separate planes, directories that cannot be parsed.

    Args:
        source: The file's bytes, or the file opened in binary mode (its strips or
            tiles read with os.pread on its descriptor).
        threads: Decoding threads (default: the CPUs); 1 decodes on the calling thread.
    Returns: (H, W) gray or (H, W, 3|4) BGR(A), C-contiguous, or None.
    Raises:
        DamagedTiff: A file it takes whose strips or tiles are damaged: cut short, a Deflate
            stream that does not decode to the block's rows (its checksum catches any
            change), or an LZW stream with a code outside its table or too short for
            the strip (LZW has no checksum: other changes decode to other pixels, as in
            every reader). OpenCV returns such an image with the damaged rows wrong,
            saying so only in its log.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        whole = memoryview(source)
        f: BinaryIO = io.BytesIO(source)
        length = len(whole)

        def read_at(offset: int, size: int):
            return whole[offset : offset + size]
    else:
        f, fd = source, source.fileno()
        length = os.fstat(fd).st_size

        def read_at(offset: int, size: int):
            return os.pread(fd, size, offset)

    if _tiff_strips is None:
        return None
    try:
        layout = _layout(f, length)
    except (OSError, ValueError, KeyError, IndexError, struct.error):
        return None
    if layout is None:
        return None
    h, w, channels, dtype = layout.h, layout.w, layout.channels, layout.dtype
    offsets, counts = layout.offsets, layout.counts
    from .hostmem import host_empty

    shape = (h, w) if channels == 1 else (h, w, channels)
    out = host_empty(shape, dtype.newbyteorder("="))
    what = "tile" if layout.tiled else "strip"

    ends = offsets + counts
    if ends.max() > length:
        first = int(np.argmax(ends > length))
        raise DamagedTiff(f"the file ends at byte {length}, inside {what} {first + 1} of "
                          f"{len(offsets)}")  # fmt: skip

    row_bytes = w * channels * dtype.itemsize
    units = None
    if layout.codec is None and not layout.tiled:
        units = _units(offsets, counts, layout.block_h, h, row_bytes, UNIT_BYTES)

    def decoded(i: int, size: int) -> bytes:
        """Block i's `size` bytes, decompressed (never more than the block holds)."""
        data = read_at(int(offsets[i]), int(counts[i]))
        try:
            if layout.codec == "deflate":
                data = zlib.decompressobj().decompress(data, size)
            elif layout.codec == "lzw":
                if data[:1] == b"\0" and data[1:2] and data[1] & 1:
                    raise _OldLzw  # libtiff's "old-style" LZW (before TIFF 5.0)
                data = _tiff_strips.lzw(data, size)
        except (zlib.error, ValueError) as e:
            raise DamagedTiff(f"{what} {i + 1} of {len(offsets)}: {e}") from None
        if len(data) < size:
            raise DamagedTiff(f"{what} {i + 1} of {len(offsets)} holds {len(data)} of its "
                              f"{size} bytes")  # fmt: skip
        return data

    def place(dst: np.ndarray, data: Any, width: int) -> None:
        _tiff_strips.place(dst, data, width, channels, dtype.itemsize, layout.predict,
                           not dtype.isnative)  # fmt: skip

    def strip(i: int) -> None:
        rows = layout.block_h
        start = i * rows
        if units is not None and units[i] > 1:  # strips that follow each other, whole
            n = min(units[i] * rows, h - start)
            place(out[start : start + n], read_at(int(offsets[i]), n * row_bytes), w)
            return
        n = min(rows, h - start)
        place(out[start : start + n], decoded(i, n * row_bytes), w)

    across = -(-w // layout.block_w)

    def tile(i: int) -> None:
        th, tw = layout.block_h, layout.block_w
        y, x = (i // across) * th, (i % across) * tw
        data = decoded(i, th * tw * channels * dtype.itemsize)
        place(out[y : y + th, x : x + tw], data, tw)  # past the right or bottom edge: cropped

    decode = tile if layout.tiled else strip
    firsts = range(len(offsets)) if units is None else np.flatnonzero(units).tolist()
    threads = min(threads or os.cpu_count() or 1, len(firsts))
    try:
        if threads == 1:
            for i in firsts:
                decode(i)
        else:
            with ThreadPoolExecutor(threads) as pool:
                for _ in pool.map(decode, firsts):
                    pass
    except _OldLzw:
        return None
    return out


def _units(offsets: np.ndarray, counts: np.ndarray, rows: int, h: int, row_bytes: int,
           limit: int) -> np.ndarray:  # fmt: skip
    """Uncompressed strips read and placed together: for each strip, how many strips
    from it make one read (0 for a strip inside another's). Runs of strips that follow
    each other in the file, each holding exactly its rows, up to `limit` bytes."""
    n = len(offsets)
    strip_bytes = np.minimum(rows, h - np.arange(n) * rows) * row_bytes
    whole = counts == strip_bytes
    joins = whole[:-1] & whole[1:] & (offsets[1:] == offsets[:-1] + counts[:-1])
    most = max(1, limit // (rows * row_bytes))
    units = np.zeros(n, np.int64)
    i = 0
    while i < n:
        j = i + 1
        while j < n and j - i < most and joins[j - 1]:
            j += 1
        units[i] = j - i
        i = j
    return units


class DamagedTiff(ValueError):
    """A TIFF that `read` takes, with damaged strips or tiles (the message says which)."""


class _OldLzw(Exception):
    """A strip in the LZW variant of TIFFs before 5.0: left to OpenCV (libtiff)."""


class _Layout(NamedTuple):
    """What `read` needs of a file's first directory. Blocks are its strips (`block_w`
    the image's width) or its tiles, row by row (padded past the image's right and
    bottom edges)."""

    h: int
    w: int
    channels: int
    dtype: np.dtype  # in the file's byte order
    codec: str | None  # None (uncompressed), "deflate" or "lzw"
    predict: bool  # horizontal differencing, within each block's rows
    block_h: int  # rows per strip, or the tiles' length
    block_w: int
    offsets: np.ndarray
    counts: np.ndarray
    tiled: bool


def _layout(f: BinaryIO, length: int) -> _Layout | None:
    """The `_Layout` of the first directory of `f` (`length` bytes), or None where
    `read` does not take the file."""
    f.seek(0)
    head = f.read(16)
    if head[:4] not in TIFF_MAGIC:
        return None
    order = "<" if head[:2] == b"II" else ">"
    tags = _tags(f, head, length)
    first = {tag: values[0] for tag, values in tags.items() if len(values)}
    tiled = any(tag in tags for tag in _TILES)
    if tiled and not all(tag in first for tag in _TILES):
        return None
    if first.get(274, 1) != 1 or first.get(266, 1) != 1:
        return None  # an orientation, bits in reverse order
    h, w = int(first[257]), int(first[256])
    channels = int(first.get(277, 1))
    bits, formats = set(tags.get(258, [1])), set(tags.get(339, [1]))
    photometric, extra = first.get(262), list(tags.get(338, []))
    if len(bits) != 1 or len(formats) != 1:
        return None
    kind = {(8, 1): "u1", (16, 1): "u2", (32, 3): "f4"}.get((bits.pop(), formats.pop()))
    if kind is None:
        return None
    dtype = np.dtype(order + kind)
    gray, rgb = (1, 1, []), (2, 3, [])
    if (photometric, channels, extra) not in (gray, rgb, (2, 4, [0]), (2, 4, [])):
        return None
    compression, predictor = first.get(259, 1), first.get(317, 1)
    if compression not in (1, _LZW, *_DEFLATE) or first.get(284, 1) != 1:
        return None
    if predictor not in (1, 2) or (predictor == 2 and dtype.kind != "u"):
        return None
    if tiled:
        block_h, block_w = int(first[323]), int(first[322])
        offsets, counts = tags[324].astype(np.int64), tags[325].astype(np.int64)
    else:
        block_h, block_w = min(int(first.get(278, h)), h), w
        offsets, counts = tags[273].astype(np.int64), tags[279].astype(np.int64)
    if h < 1 or w < 1 or block_h < 1 or block_w < 1:
        return None
    if not len(offsets) == len(counts) == -(-h // block_h) * -(-w // block_w):
        return None
    if h * w > pixel_limit():
        return None  # OpenCV refuses it, naming its limit
    # libtiff differences only compressed blocks (it ignores a predictor without one)
    predict = predictor == 2 and compression != 1
    codec = "lzw" if compression == _LZW else "deflate" if compression != 1 else None
    return _Layout(h, w, channels, dtype, codec, predict, block_h, block_w, offsets, counts,
                   tiled)  # fmt: skip


def _tags(f: BinaryIO, head: bytes, length: int) -> dict[int, np.ndarray]:
    """The first directory's fields (`head`: the file's first 16 bytes) as arrays
    (`headers.tiff_fields`); ValueError for a field said to be longer than the file."""
    fields = tiff_fields(f, head, length)
    return {tag: np.frombuffer(raw, fmt, count) for tag, (fmt, count, raw) in fields.items()}
