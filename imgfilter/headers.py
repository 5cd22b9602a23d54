"""An image file's size in pixels from its first bytes, without decoding it.

`decoded_bytes(path)` reads the header of a PNG, JPEG or TIFF file (the IHDR chunk, the
frame header, the first directory) and gives the bytes its image will take once decoded,
so that the CLI can choose the CPU or the GPU for a photo before reading it. A hint only:
None for other formats and for anything it cannot parse, and the caller still decides on
the image it read (a header can lie; the decoder is the judge). Only the standard
library: the CLI asks before NumPy is imported.
"""

from __future__ import annotations

import os
import stat
import struct
from typing import BinaryIO

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PNG colour types -> channels as OpenCV decodes them: palette images expand to 3 (4
# with a tRNS chunk, which this does not look for), gray with alpha to 4.
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 4, 6: 4}
# JPEG frame headers (SOF0-SOF15 less DHT C4, JPG C8, DAC CC).
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_NO_LENGTH = frozenset([0x01, *range(0xD0, 0xD8)])  # TEM, RST0-7
_JPEG_MAX_SEGMENTS = 64  # the frame header comes after a few APPn / DQT / DHT segments
TIFF_MAGIC = (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")  # classic and BigTIFF, both byte orders
TIFF_TYPES = {1: "B", 3: "H", 4: "I", 16: "Q"}  # BYTE, SHORT, LONG, LONG8 fields


def host_pixel_limit() -> int:
    """The host's memory in bytes (at least 2**30): the most pixels imgfilter lets
    OpenCV decode, since large rasters are what it is for (a pixel takes a byte at
    least, so a file claiming more could never be held)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
        memory = 1 << 34
    return max(1 << 30, memory)


def pixel_limit() -> int:
    """The most pixels an image may have to be decoded: OPENCV_IO_MAX_IMAGE_PIXELS where
    set (OpenCV's own limit), else `host_pixel_limit` (what imgfilter sets it to before
    it first imports cv2: `io_native.import_cv2`); imgfilter's own readers follow it."""
    try:
        return int(os.environ["OPENCV_IO_MAX_IMAGE_PIXELS"])
    except (KeyError, ValueError):
        return host_pixel_limit()


def decoded_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes of the image in `path` once decoded (height x width x channels x bytes per
    sample, as imgfilter.io reads it: JPEG 8-bit, CMYK as 3 channels), from its header;
    None if the file is not a regular PNG, JPEG or TIFF file or its header cannot be
    parsed."""
    try:
        # Not waiting for a writer: a FIFO (or a device) is no image file to look into.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        with os.fdopen(fd, "rb") as f:
            head = f.read(32)
            if head.startswith(PNG_SIGNATURE):
                return _png(head)
            if head[:2] == b"\xff\xd8":
                return _jpeg(f)
            if head[:4] in TIFF_MAGIC:
                return _tiff(f, os.fstat(f.fileno()).st_size)
    except (OSError, ValueError, struct.error, KeyError, IndexError):
        return None
    return None


def _png(head: bytes) -> int | None:
    """From the IHDR chunk, which a PNG must start with."""
    if head[12:16] != b"IHDR":
        return None
    w, h, depth, colour = struct.unpack(">IIBB", head[16:26])
    return w * h * _PNG_CHANNELS[colour] * (2 if depth == 16 else 1)


def _jpeg(f: BinaryIO) -> int | None:
    """From the frame header (SOFn), walking the segments before it."""
    f.seek(2)
    for _ in range(_JPEG_MAX_SEGMENTS):
        byte = f.read(1)
        while byte == b"\xff":  # fill bytes before a marker
            marker = f.read(1)
            if marker != b"\xff":
                break
        else:
            return None
        if not marker:
            return None
        code = marker[0]
        if code in _JPEG_NO_LENGTH:
            continue
        (length,) = struct.unpack(">H", f.read(2))
        if code in _JPEG_SOF:
            _, h, w, components = struct.unpack(">BHHB", f.read(6))
            if h == 0:  # the height comes later, in a DNL segment
                return None
            return h * w * min(components, 3)
        if code == 0xDA or length < 2:  # the scan starts: no frame header before it
            return None
        f.seek(length - 2, os.SEEK_CUR)
    return None


def tiff_fields(
    f: BinaryIO, head: bytes, length: int, wanted: tuple[int, ...] | None = None
) -> dict[int, tuple[str, int, bytes]]:
    """The fields of the first directory of the TIFF or BigTIFF open as `f` (`length`
    bytes; `head` its first 16), of the types in TIFF_TYPES (all, or the tags in
    `wanted`): {tag: (struct format with the file's byte order, count, value bytes)}.
    ValueError for a field said to be longer than the file."""
    order = "<" if head[:2] == b"II" else ">"
    big = head[2:4] in (b"+\0", b"\0+")
    count_fmt, entry, offset_fmt = ("Q", 20, "Q") if big else ("H", 12, "I")
    (at,) = struct.unpack_from(order + offset_fmt, head, 8 if big else 4)
    f.seek(at)
    (n,) = struct.unpack(order + count_fmt, f.read(struct.calcsize(count_fmt)))
    raw = f.read(n * entry)
    field = 8 if big else 4
    fields = {}
    for i in range(min(n, len(raw) // entry)):
        tag, kind = struct.unpack_from(order + "HH", raw, i * entry)
        fmt = TIFF_TYPES.get(kind)
        if fmt is None or (wanted is not None and tag not in wanted):
            continue
        (count,) = struct.unpack_from(order + offset_fmt, raw, i * entry + 4)
        size = struct.calcsize(fmt) * count
        if size > length:
            raise ValueError("a field longer than the file")
        value = raw[i * entry + 4 + field : (i + 1) * entry]
        if size > field:
            (where,) = struct.unpack(order + offset_fmt, value)
            f.seek(where)
            value = f.read(size)
        fields[tag] = (order + fmt, count, value[:size])
    return fields


def _tiff(f: BinaryIO, length: int) -> int | None:
    """From the first directory: ImageWidth, ImageLength, SamplesPerPixel and the
    largest BitsPerSample (tags 256, 257, 277, 258)."""
    f.seek(0)
    head = f.read(16)
    fields = tiff_fields(f, head, length, (256, 257, 258, 277))
    values = {tag: struct.unpack(f"{fmt[0]}{count}{fmt[1]}", raw)
              for tag, (fmt, count, raw) in fields.items()}  # fmt: skip
    w, h = values[256][0], values[257][0]
    samples = values[277][0] if 277 in values else 1
    bits = max(values.get(258, (1,)))
    return w * h * samples * max(1, bits // 8)
