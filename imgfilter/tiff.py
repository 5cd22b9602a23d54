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
in-memory TIFF reader fails past 4 GiB), counting a TIFF's pages with `page_count`.
"""

from __future__ import annotations

import collections
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import numpy as np

# Larger TIFF results go through `write`: OpenCV's LZW can grow incompressible data by
# half, so above this size its classic TIFF could pass 4 GiB.
BIGTIFF_MIN_BYTES = 2 << 30
STRIP_BYTES = 1 << 21  # raw bytes per strip, about: small enough for many threads
DEFLATE_LEVEL = 1  # zlib's fastest: about twice level 6's speed for 20% larger files

_SHORT, _LONG, _LONG8 = 3, 4, 16  # TIFF field types
_TAG = struct.Struct("<HHQ8s")  # tag, type, count, value or offset
_FORMATS = {"u": 1, "f": 3}  # SampleFormat: unsigned integer, IEEE float
MAGIC = (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")  # classic and BigTIFF, both byte orders


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
    if head[:4] not in MAGIC:
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
