"""TIFF files through tifffile: BigTIFF output, and the TIFF input OpenCV gets wrong.

Writing. A classic TIFF addresses its data with 32-bit offsets, so it ends at 4 GiB, and
OpenCV writes only classic TIFF. `write` writes a BigTIFF of one image in strips of
rows, each compressed with Deflate (zlib level DEFLATE_LEVEL) on a pool of threads, and
tifffile lays out the file around them. `imgfilter.io` uses it for TIFF outputs of
BIGTIFF_MIN_BYTES or more. Samples are interleaved in RGB(A) order, as OpenCV writes TIFF
(`cv2.imread` gives BGR(A) back); integer samples with horizontal differencing
(Predictor 2), float32 samples without. A fourth channel is an unspecified extra sample
(ExtraSamples 0), as OpenCV leaves it: libtiff's RGBA reader, which OpenCV uses for 8-bit
images, would multiply the colour by a declared alpha.

Reading. `read` decodes, with tifffile (and imagecodecs for LZW) on a pool of threads,
the files whose pixels it gives exactly as ``cv2.imread(path, IMREAD_UNCHANGED)`` does:
strips or tiles, uncompressed, LZW or Deflate, uint8, uint16 or float32 samples, gray or
RGB(A). It refuses damaged ones with `DamagedTiff`, where OpenCV returns the damaged rows
wrong and only logs it. Every other layout is left to OpenCV (None).
"""

from __future__ import annotations

import collections
import functools
import io
import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import numpy as np

from .headers import pixel_limit

# Larger TIFF results go through `write`: OpenCV's LZW can grow incompressible data by
# half, so above this size its classic TIFF could pass 4 GiB.
BIGTIFF_MIN_BYTES = 2 << 30
STRIP_BYTES = 1 << 21  # raw bytes per strip, about: small enough for many threads
DEFLATE_LEVEL = 1  # zlib's fastest: about twice level 6's speed for 20% larger files

# tifffile logs what it finds odd in a file; imgfilter reports problems as one line of
# its own, so its records go nowhere unless an application adds a handler.
logging.getLogger("tifffile").addHandler(logging.NullHandler())

_NONE, _LZW, _DEFLATE = 1, 5, (8, 32946)  # Compression
_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32))


class DamagedTiff(ValueError):
    """A TIFF that `read` takes, with damaged strips or tiles (the message says which)."""


def write(f: BinaryIO, img: np.ndarray, threads: int | None = None) -> None:
    """Write `img` as a BigTIFF into the open, empty, seekable binary file `f`.

    Args:
        f: The file, positioned at its start.
        img: (H, W) gray or (H, W, 3|4) BGR/BGRA, uint8, uint16 or float32, C-contiguous.
        threads: Compression threads (default: the CPUs).
    """
    import tifffile

    h, w = img.shape[:2]
    channels = 1 if img.ndim == 2 else img.shape[2]
    rows = max(1, min(h, STRIP_BYTES // max(1, w * channels * img.itemsize)))
    predict = img.dtype.kind == "u"
    workers = threads or os.cpu_count() or 1
    with ThreadPoolExecutor(workers) as pool:
        tifffile.imwrite(
            tifffile.FileHandle(f, name="TIFF"),  # a name: that of os.fdopen's is an int
            _strips(pool, img, rows, predict, 2 * workers),
            shape=img.shape,
            dtype=img.dtype,
            bigtiff=True,
            byteorder="<",
            photometric="rgb" if channels >= 3 else "minisblack",
            planarconfig="contig" if channels > 1 else None,
            extrasamples=(0,) if channels == 4 else None,
            compression="zlib",
            predictor=predict,
            rowsperstrip=rows,
            metadata=None,
        )


def _strips(pool: ThreadPoolExecutor, img: np.ndarray, rows: int, predict: bool,
            ahead: int) -> Iterator[bytes]:  # fmt: skip
    """The compressed strips of `img` in order, compressed on `pool`, at most `ahead`
    waiting at a time (tifffile writes what it is given as each strip's bytes)."""
    pending: collections.deque = collections.deque()
    for start in range(0, img.shape[0], rows):
        pending.append(pool.submit(_strip, img[start : start + rows], predict))
        if len(pending) > ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _strip(rows: np.ndarray, predict: bool) -> bytes:
    """One strip's Deflate stream: RGB(A) order, differenced along rows if `predict`."""
    import zlib

    if rows.ndim == 3 and rows.shape[2] >= 3:
        rows = rows[:, :, [2, 1, 0, 3][: rows.shape[2]]]  # a copy
    elif predict:
        rows = np.array(rows)  # differenced in place below
    if predict:
        # Each sample minus the same sample of the pixel to its left, modulo 2**bits.
        rows[:, 1:] -= rows[:, :-1].copy()
    little = np.ascontiguousarray(rows, dtype=rows.dtype.newbyteorder("<"))  # the file's "II"
    return zlib.compress(little.data, DEFLATE_LEVEL)


def page_count(f: BinaryIO | bytes) -> int:
    """How many images (pages) the TIFF or BigTIFF file `f` (open, or its bytes) holds;
    1 when it is not one or its chain of pages cannot be followed."""
    import tifffile

    source = io.BytesIO(f) if isinstance(f, (bytes, bytearray, memoryview)) else f
    try:
        with tifffile.TiffFile(source, name="TIFF") as tif:
            return max(1, len(tif.pages))
    except Exception:  # noqa: BLE001 - not a TIFF tifffile can parse: one image
        return 1


def read(source: BinaryIO | bytes, threads: int | None = None) -> np.ndarray | None:
    """The image of a TIFF or BigTIFF file as `cv2.imread(path, IMREAD_UNCHANGED)`
    gives it, decoded by tifffile on a pool of threads; None where this reader does not
    take the file (OpenCV then decodes it, or says what is wrong with it).

    Taken: the first page of a file in strips or tiles, uncompressed, LZW (TIFF 5.0 and
    later) or Deflate, without differencing or with horizontal differencing of integer
    samples, interleaved samples of 8-bit or 16-bit unsigned integers or 32-bit floats,
    gray (black is zero, one sample) or RGB (three, or four with an unspecified fourth,
    as this module and OpenCV write it), no orientation but the default, either byte
    order, at most `headers.pixel_limit()` pixels. Not taken: other compressions (JPEG,
    PackBits, ...), other sample types or interpretations (palette, white is zero,
    YCbCr, a declared alpha, which OpenCV's 8-bit reader premultiplies), separate planes,
    files tifffile cannot parse.

    Args:
        source: The file's bytes, or the file opened in binary mode.
        threads: Decoding threads (default: the CPUs); 1 decodes on the calling thread.
    Returns: (H, W) gray or (H, W, 3|4) BGR(A), C-contiguous, or None.
    Raises:
        DamagedTiff: A file it takes whose strips or tiles are damaged: past the file's
            end, a Deflate stream that does not decode to the block's rows (its checksum
            catches any change), or an LZW stream that is corrupt or too short (LZW has
            no checksum: other changes decode to other pixels, as in every reader).
    """
    import tifffile

    whole = isinstance(source, (bytes, bytearray, memoryview))
    f: Any = io.BytesIO(source) if whole else source
    length = len(source) if whole else os.fstat(f.fileno()).st_size
    f.seek(0)  # tifffile takes the file from where it stands
    try:
        tif = tifffile.TiffFile(f, name="TIFF")  # a name: that of os.fdopen's is an int
    except Exception:  # noqa: BLE001 - not a TIFF tifffile parses: OpenCV's to judge
        return None
    with tif:
        try:
            page = tif.pages[0]
            taken = _takes(page) and not _old_lzw(page, f)
        except Exception:  # noqa: BLE001 - no page, fields tifffile cannot parse
            taken = False
        if not taken:
            return None
        what = "tile" if page.is_tiled else "strip"
        ends = np.asarray(page.dataoffsets, np.int64) + np.asarray(page.databytecounts, np.int64)
        if ends.max() > length:
            first = int(np.argmax(ends > length))
            raise DamagedTiff(f"the file ends at byte {length}, inside {what} {first + 1} "
                              f"of {len(ends)}")  # fmt: skip
        from .hostmem import host_empty

        out = host_empty(page.shape, page.dtype.newbyteorder("="))
        workers = threads or os.cpu_count() or 1
        try:
            if int(page.compression) == _NONE and page.is_contiguous:  # read into `out`
                if min(page.databytecounts) == 0:
                    raise DamagedTiff(f"a {what} of {len(ends)} is empty")
                page.asarray(out=out, maxworkers=workers)
                if out.ndim == 3:  # in bands: OpenCV copies a source that is its target
                    rows = max(1, (1 << 20) // (out[0].nbytes))
                    for y in range(0, out.shape[0], rows):
                        _to_bgr(out[y : y + rows], out[y : y + rows])
            else:
                place = functools.partial(_place, out, what)
                for _ in page.segments(func=place, maxworkers=workers):
                    pass
        except DamagedTiff:
            raise
        except Exception as e:  # noqa: BLE001 - codecs raise their own types
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise DamagedTiff(f"a {what} of {len(ends)} does not decode ({detail})") from None
    return out


def _place(out: np.ndarray, what: str, decoded: tuple) -> None:
    """Put one decoded strip or tile (tifffile's `segments`: the samples, their place,
    their shape) into `out` in OpenCV's channel order, cut at the image's edges."""
    samples, (_, _, y, x, _), _ = decoded
    if samples is None:  # no bytes at all: tifffile would fill it with zeros
        raise DamagedTiff(f"a {what} at row {y}, column {x} is empty")
    h, w = out.shape[:2]
    part = samples[0, : h - y, : w - x]  # (rows, columns, samples)
    into = out[y : y + part.shape[0], x : x + part.shape[1]]
    if out.ndim == 2:
        into[...] = part[..., 0]
        return
    _to_bgr(part, into)


def _to_bgr(rgb: np.ndarray, into: np.ndarray) -> None:
    """RGB(A) samples `rgb` put into `into` (a view of the image, or `rgb` itself) as
    BGR(A)."""
    import cv2

    code = cv2.COLOR_RGB2BGR if rgb.shape[2] == 3 else cv2.COLOR_RGBA2BGRA
    done = cv2.cvtColor(rgb, code, dst=into)  # OpenCV writes into the view
    if not np.shares_memory(done, into):  # (a binding that copied instead)
        into[...] = done


def _takes(page: Any) -> bool:
    """Whether `read` takes this first page (see its docstring)."""
    tags = page.tags

    def value(tag: int, default: Any) -> Any:
        return tags.valueof(tag, default)

    samples, extra = page.samplesperpixel, tuple(page.extrasamples or ())
    photometric, compression, predictor = page.photometric, page.compression, page.predictor
    layouts = {(1, 1, ()), (2, 3, ()), (2, 4, (0,)), (2, 4, ())}  # photometric, samples, extra
    return (
        page.is_tiled == (322 in tags) == (324 in tags)  # TileWidth, TileOffsets: both or none
        and value(274, 1) == 1  # Orientation
        and value(266, 1) == 1  # FillOrder: bits in the usual order
        and page.imagedepth == 1
        and page.dtype in _DTYPES
        and page.bitspersample == page.dtype.itemsize * 8
        and (int(photometric), samples, extra) in layouts
        and (samples == 1 or int(page.planarconfig) == 1)
        and int(compression) in (_LZW, *_DEFLATE, _NONE)
        # libtiff ignores a predictor on uncompressed data, tifffile does not: OpenCV's
        and (
            int(predictor) == 1
            or (int(predictor) == 2 and page.dtype.kind == "u" and int(compression) != _NONE)
        )  # fmt: skip
        and len(page.dataoffsets) == len(page.databytecounts) > 0
        and page.shape[0] * page.shape[1] <= pixel_limit()  # OpenCV refuses it, naming it
    )


def _old_lzw(page: Any, f: Any) -> bool:
    """Whether the strips are in the LZW of TIFFs before 5.0 (libtiff: a first byte 0,
    a second one odd), which OpenCV's libtiff decodes and imagecodecs does not."""
    if int(page.compression) != _LZW:
        return False
    f.seek(int(page.dataoffsets[0]))
    head = f.read(2)
    return len(head) == 2 and head[0] == 0 and bool(head[1] & 1)
