"""Reading and writing image files: OpenCV first, Pillow as the fallback reader.

    img = read_image("photo.jpg")        # (H, W, 3) uint8 BGR, EXIF orientation applied
    out = check_output("photo.blur.jpg", input_path="photo.jpg", dtype=img.dtype, channels=3)
    write_image(out, result)             # atomic; refuses formats that would lose data

Arrays are what OpenCV uses: (H, W) gray, (H, W, 3) BGR or (H, W, 4) BGRA, of dtype uint8,
uint16 or float32, C-contiguous.

Reading. The file is read once and decoded with ``cv2.imdecode(IMREAD_UNCHANGED)``, which
keeps 16-bit samples and alpha. That flag also skips EXIF orientation, which
``cv2.imread(path)`` applies, so the orientation tag of JPEG, PNG and WebP files is read
here (from the bytes already in memory) and applied with numpy, giving the pixels
``cv2.imread`` gives. (OpenCV's TIFF decoder applies the TIFF orientation tag itself.)
Files of DECODE_FROM_PATH_BYTES (1 GiB) or more are decoded from their path
(``cv2.imread``) after the same checks of their bytes: OpenCV decodes no buffer of 2 GiB
or more. TIFFs in strips or tiles, uncompressed, LZW or Deflate (as OpenCV, imgfilter
and GDAL write them), are decoded by `imgfilter.tiff.read` instead, from the open file,
to the same pixels (on a pool of threads from TIFF_THREADS_MIN_BYTES, 16 MiB); their
damaged strips or tiles are an error (OpenCV decodes them to wrong rows and only logs
it). Smaller files OpenCV cannot decode go to Pillow. JPEG, PNG and WebP files are
checked for completeness first: OpenCV 4.8 turns a JPEG cut short into a whole image
with a grey bottom and only prints a warning (5.0 returns nothing), and Pillow does not
check PNG IDAT checksums. Decoder chatter on stderr (OpenCV's log, libpng, libjpeg) is
captured while decoding, so a user sees only our one-line error.

Writing. The format follows the extension. OpenCV silently converts what a format cannot
hold (uint16 to 8 bits for JPEG, float32 to 8 bits for PNG, BGRA to BGR for JPEG, ...);
here such combinations are refused with an `OutputError` that names an extension that
can hold the image. What each format holds, each combination verified to round-trip
exactly (JPEG: within its lossy coding) on OpenCV 4.8 and 5.0:

    extension        dtypes                    channels
    .jpg .jpeg       uint8                     1, 3        (lossy, quality 95 or `quality`)
    .png             uint8, uint16             1, 3, 4
    .tif .tiff       uint8, uint16, float32    1, 3, 4     (LZW; images of 2 GiB or more:
                                                            BigTIFF, Deflate, `tiff`)
    .bmp             uint8                     1, 3, 4     (4: see below)
    .webp            uint8                     1, 3, 4     (lossless unless `quality`; 1 ch. reads
                                                            back as 3 equal channels)
    .npy             uint8, uint16, float32    1, 3, 4     (NumPy's format, the array as it is;
                                                            read memory-mapped)

Two rows depend on the OpenCV version. BMP with alpha needs IMWRITE_BMP_COMPRESSION
(OpenCV 5.0 has it; 4.8 writes 32-bit BI_RGB, whose fourth byte readers drop), so 4
channels are refused without it. Lossless WebP drops the colour under fully transparent
pixels unless IMWRITE_WEBP_LOSSLESS_PRESERVE_COLOR is set (5.0); without that constant
4-channel WebP is encoded by Pillow with exact=True.

`quality` (0-100) makes JPEG use that quality instead of 95 and WebP lossy at that
quality instead of lossless; other formats refuse it. `metadata` (from `read_metadata`)
puts an EXIF block and an ICC profile into JPEG, PNG and WebP outputs (TIFF and BMP
outputs get neither); the EXIF orientation is set to 1, since `read_image` has already
turned the pixels upright.

Reading a file with several frames (an animated GIF, PNG or WebP, a multi-page TIFF)
gives its first frame and a `MultiFrameWarning` that says how many there are.

Writes are atomic: the encoded bytes go to a temporary file in the target's directory,
are fsync'ed, and are then renamed onto the target, so a failure leaves an existing file
untouched and no partial file behind. A process that must stop at once (the CLI on
Ctrl-C) calls `abandon_io()` first: it removes the temporary files of writes still in
progress and gives file descriptor 2 back to stderr if a decoder had borrowed it.

This module imports cv2 and PIL only inside functions (and never numba), so importing it
is cheap.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import mmap
import os
import re
import stat
import struct
import sys
import tempfile
import threading
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .errors import InputError, OutputError, UsageError
from .headers import TIFF_MAGIC, pixel_limit

__all__ = [
    "SUPPORTED_WRITE_EXTENSIONS",
    "DirectorySync",
    "ImageMetadata",
    "MultiFrameWarning",
    "abandon_io",
    "check_format",
    "check_output",
    "default_output",
    "read_image",
    "read_metadata",
    "write_image",
]

# A file's contents for `atomic_write`: its bytes, or a function that writes them into
# the open file (a .npy array, streamed rather than encoded in memory).
Contents = bytes | Callable[[BinaryIO], Any]
_DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32))


# ---------------------------------------------------------------------------------------
# Leaving at once (Ctrl-C)

# What an unfinished read or write holds: temporary files not yet renamed onto their
# target, and the duplicates of file descriptor 2 saved while a decoder's chatter is
# captured. `abandon_io` (another thread, the process about to os._exit) undoes both.
_held_lock = threading.Lock()
_temp_files: set[Path] = set()
_saved_stderr_fds: list[int] = []
_abandoned = False


def abandon_io() -> None:
    """Remove the temporary files of unfinished writes and point file descriptor 2 back
    at the real stderr; writes started afterwards fail. For a process that is about to
    end with os._exit while another thread may still be reading or writing an image.
    """
    global _abandoned
    with _held_lock:
        _abandoned = True
        for tmp in list(_temp_files):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        _temp_files.clear()
        if _saved_stderr_fds:
            with contextlib.suppress(OSError):
                os.dup2(_saved_stderr_fds[0], 2)


# ---------------------------------------------------------------------------------------
# Quieting native decoders


# "[ERROR:0@0.411] global grfmt_tiff.cpp:117 TIFF_Error " and
# "OpenCV(4.8.0) /io/.../bitstrm.cpp:102: error: (-2:Unspecified error) " carry no news.
_LOG_PREFIX = re.compile(r"^\[\s*[A-Z]+:\d+(?:@[\d.]+)?\]\s+(?:global\s+)?\S+:\d+\s+\S+\s+")
_CV_ERROR_PREFIX = re.compile(r"OpenCV\([^)]*\)\s+\S+:\d+:\s+error:\s+\([^)]*\)\s*")


class _Captured:
    """Text the native libraries wrote to stderr inside `_quiet_native()`."""

    text = ""

    def last_line(self) -> str:
        """The last error line (else the last line), without OpenCV's log decoration."""
        lines = [line.strip() for line in self.text.splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()]
        line = (errors or lines or [""])[-1]
        line = _CV_ERROR_PREFIX.sub("", _LOG_PREFIX.sub("", line))
        return line if len(line) <= 200 else line[:197] + "..."


# One capture is shared by the threads that decode or encode at the same time (the
# many-files pipeline, imgfilter.files): file descriptor 2 and OpenCV's log level are
# process-wide, so the first thread in redirects them and the last one out restores them.
_capture_depth = 0
_capture_sink: Any = None  # the temporary file that descriptor 2 points at meanwhile
_capture_level: tuple[Any, Any] | None = None  # (OpenCV's logging module, its old level)


@contextlib.contextmanager
def _quiet_native(cv2: Any) -> Iterator[_Captured]:
    """Quiet OpenCV's log and capture what native code prints on file descriptor 2.

    OpenCV's log is lowered to errors only (its warnings are noise to a user), and
    libpng and libjpeg write straight to the C stderr past that log level, so file
    descriptor 2 points at a temporary file for the duration. What landed there is
    available afterwards as `.text` and `.last_line()` (to explain a failed decode).
    Anything another thread writes to stderr meanwhile is captured too. Threads inside
    at the same time share one capture (the first in redirects, the last out
    restores), so each sees what was written from its start to its end, its
    neighbours' chatter included.
    """
    captured = _Captured()
    start = _begin_capture(cv2)
    if start is None:  # no stderr at all: nothing to silence
        yield captured
        return
    try:
        yield captured
    finally:
        captured.text = _end_capture(start)


def _begin_capture(cv2: Any) -> int | None:
    """Join (or start) the shared capture; the sink's offset where this one starts."""
    global _capture_depth, _capture_sink, _capture_level
    with _held_lock:
        if _capture_depth == 0:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            try:
                saved_fd = os.dup(2)
            except OSError:
                return None
            _capture_sink = tempfile.TemporaryFile()
            _saved_stderr_fds.append(saved_fd)
            if not _abandoned:
                os.dup2(_capture_sink.fileno(), 2)
            logging = getattr(getattr(cv2, "utils", None), "logging", None)
            if logging is None or not hasattr(logging, "setLogLevel"):
                logging = cv2 if hasattr(cv2, "setLogLevel") else None  # OpenCV 4.8
            _capture_level = None
            if logging is not None:
                old_level = logging.getLogLevel()
                logging.setLogLevel(min(old_level, 2))  # LOG_LEVEL_ERROR; errors get captured
                _capture_level = (logging, old_level)
        _capture_depth += 1
        return os.lseek(_capture_sink.fileno(), 0, os.SEEK_END)


def _end_capture(start: int) -> str:
    """Leave the shared capture; what was written to it since `start`."""
    global _capture_depth, _capture_sink, _capture_level
    with _held_lock:
        sink = _capture_sink
        fd = sink.fileno()
        end = os.lseek(fd, 0, os.SEEK_END)
        if hasattr(os, "pread"):
            data = os.pread(fd, end - start, start) if end > start else b""
        else:  # pragma: no cover - Windows; nothing else writes while it is captured
            sink.seek(start)
            data = sink.read(end - start)
            sink.seek(0, os.SEEK_END)
        _capture_depth -= 1
        if _capture_depth == 0:
            saved_fd = _saved_stderr_fds.pop()
            if not _abandoned:
                os.dup2(saved_fd, 2)
            os.close(saved_fd)
            sink.close()
            _capture_sink = None
            if _capture_level is not None:
                logging, old_level = _capture_level
                logging.setLogLevel(old_level)
                _capture_level = None
    return data.decode("utf-8", "replace")


def _import_cv2() -> Any:
    import cv2

    return cv2


# ---------------------------------------------------------------------------------------
# Reading


# Files this large are decoded from their path: cv2.imdecode takes no buffer of 2 GiB
# or more (its length is an int) and its TIFF reader fails to seek past 4 GiB; and the
# file's bytes need not be held beside the image.
DECODE_FROM_PATH_BYTES = 1 << 30
# TIFFs that `imgfilter.tiff.read` takes are decoded on a pool of threads from this size
# (OpenCV decodes on one thread), on the calling thread below it.
TIFF_THREADS_MIN_BYTES = 16 << 20

_KIND_NAMES = {
    "jpeg": "JPEG",
    "png": "PNG",
    "webp": "WebP",
    "tiff": "TIFF",
    "bmp": "BMP",
    "gif": "GIF",
}


def _sniff(data: bytes) -> str | None:
    """The container format from the file's first bytes (not its extension)."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:4] in TIFF_MAGIC:
        return "tiff"
    if data.startswith(b"BM"):
        return "bmp"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    return None


@dataclass(frozen=True)
class _Scan:
    """What walking a container's structure found: a problem, and the EXIF payload."""

    problem: str | None = None
    exif: bytes | None = None


def _scan_jpeg(d: bytes, whole: bool = True) -> _Scan:
    """Walk the JPEG marker segments up to the first scan; the scan must end with EOI
    (not looked for without `whole`: the EXIF only is wanted).

    Inside entropy-coded data a 0xFF byte is always followed by 0x00 or a marker, and
    FF D9 is the end-of-image marker, so its absence after the first SOS means the file
    was cut short. Searching from the SOS skips an EXIF thumbnail's own EOI.
    """
    n, pos, exif = len(d), 2, None
    truncated = _Scan("truncated JPEG (the file ends inside its header)")
    while True:
        if pos >= n:
            return truncated
        if d[pos] != 0xFF:  # junk between segments: libjpeg skips it with a warning
            pos = d.find(b"\xff", pos)
            if pos < 0:
                return truncated
        while pos < n and d[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            return truncated
        marker = d[pos]
        pos += 1
        if marker == 0xD9:
            return _Scan("corrupt JPEG (it ends before any image data)", exif)
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            continue
        if pos + 2 > n:
            return truncated
        end = pos + ((d[pos] << 8) | d[pos + 1])
        if end < pos + 2:
            return _Scan(f"corrupt JPEG (bad segment length at byte {pos})", exif)
        if end > n:
            return truncated
        if marker == 0xE1 and exif is None and d[pos + 2 : pos + 8] == b"Exif\x00\x00":
            exif = d[pos + 8 : end]
        if marker == 0xDA:  # start of scan
            if whole and d.find(b"\xff\xd9", end) < 0:
                return _Scan("truncated JPEG (no end-of-image marker)", exif)
            return _Scan(None, exif)
        pos = end


def _scan_png(d: bytes, whole: bool = True) -> _Scan:
    """Walk the PNG chunks; a complete file reaches IEND. Collects the eXIf chunk.

    The CRC of each critical chunk (IHDR, PLTE, IDAT, IEND) is checked, as libpng does:
    Pillow, the fallback decoder, does not check IDAT's, and would return garbage.
    Without `whole` (the EXIF only is wanted) no CRC is checked, so the image data is
    skipped over, not read.
    """
    n, pos, exif = len(d), 8, None
    view = memoryview(d)
    while True:
        if pos + 8 > n:
            return _Scan("truncated PNG (no IEND chunk)", exif)
        length, ctype = struct.unpack_from(">I4s", d, pos)
        end = pos + 12 + length
        if end > n:
            return _Scan("truncated PNG (the file ends inside a chunk)", exif)
        if whole and not ctype[0] & 0x20:  # critical chunk: upper-case first letter
            (crc,) = struct.unpack_from(">I", d, end - 4)
            if zlib.crc32(view[pos + 4 : end - 4]) != crc:
                name = ctype.decode("latin-1", "replace")
                return _Scan(f"corrupt PNG (checksum mismatch in its {name} chunk)", exif)
        if ctype == b"eXIf" and exif is None:
            exif = d[pos + 8 : pos + 8 + length]
        if ctype == b"IEND":
            return _Scan(None, exif)
        pos = end


def _scan_webp(d: bytes, whole: bool = True) -> _Scan:
    """Check the RIFF size against the file size; collects the EXIF chunk (both cheap:
    `whole` is taken for the scanners' common signature)."""
    if len(d) < 12:
        return _Scan("truncated WebP (the file ends inside its header)")
    riff_end = 8 + struct.unpack_from("<I", d, 4)[0]
    if len(d) < riff_end:
        return _Scan("truncated WebP (the file is shorter than its RIFF header says)")
    pos = 12
    while pos + 8 <= riff_end:
        fourcc, size = struct.unpack_from("<4sI", d, pos)
        if fourcc == b"EXIF":
            return _Scan(None, d[pos + 8 : pos + 8 + size])
        pos += 8 + size + (size & 1)
    return _Scan(None, None)


_SCANNERS = {"jpeg": _scan_jpeg, "png": _scan_png, "webp": _scan_webp}


def _exif_orientation(payload: bytes | None) -> int | None:
    """The Orientation tag (0x0112) of IFD0 in a TIFF-structured EXIF payload, or None."""
    if not payload:
        return None
    if payload.startswith(b"Exif\x00\x00"):
        payload = payload[6:]
    if len(payload) < 8 or payload[:2] not in (b"II", b"MM"):
        return None
    e = "<" if payload[:2] == b"II" else ">"
    magic, ifd = struct.unpack_from(e + "HI", payload, 2)
    if magic != 42 or ifd + 2 > len(payload):
        return None
    (count,) = struct.unpack_from(e + "H", payload, ifd)
    for i in range(count):
        entry = ifd + 2 + 12 * i
        if entry + 12 > len(payload):
            break
        tag, typ = struct.unpack_from(e + "HH", payload, entry)
        if tag == 0x0112:
            if typ == 3:  # SHORT
                (value,) = struct.unpack_from(e + "H", payload, entry + 8)
            elif typ == 4:  # LONG
                (value,) = struct.unpack_from(e + "I", payload, entry + 8)
            else:
                return None
            return value if 1 <= value <= 8 else None
    return None


def _apply_orientation(img: np.ndarray, orientation: int | None) -> np.ndarray:
    """Turn stored pixels upright per EXIF orientation 1..8, as OpenCV's imread does."""
    if orientation is None or orientation == 1:
        return img
    t = img.swapaxes(0, 1)  # transpose of rows and columns; channels stay last
    upright = {
        2: img[:, ::-1],  # mirrored horizontally
        3: img[::-1, ::-1],  # rotated 180
        4: img[::-1],  # mirrored vertically
        5: t,  # transposed
        6: t[:, ::-1],  # stored rotated 90 counter-clockwise: turn 90 clockwise
        7: t[::-1, ::-1],  # transverse
        8: t[::-1],  # stored rotated 90 clockwise: turn 90 counter-clockwise
    }
    return upright.get(orientation, img)


def _read_bytes(p: Path, npy: bool = False) -> bytes | None:
    """The whole file, or InputError for a missing, unreadable, directory or empty path.
    With `npy`: None for a .npy file that can be memory-mapped (a regular file), which
    is then left unread, from its first bytes (one open: a pipe is read once)."""
    try:
        with open(p, "rb") as f:
            data = f.read(len(NPY_MAGIC))
            if f.seekable():  # one read of the whole file (joining two parts copies it)
                if npy and data == NPY_MAGIC:
                    return None
                f.seek(0)
                data = f.read()
            else:
                data += f.read()
    except FileNotFoundError as e:
        raise InputError(f"cannot read {p}: no such file") from e
    except IsADirectoryError as e:
        raise InputError(f"cannot read {p}: it is a directory, not an image file") from e
    except PermissionError as e:
        if p.is_dir():  # Windows reports a directory as a permission problem
            raise InputError(f"cannot read {p}: it is a directory, not an image file") from e
        raise InputError(f"cannot read {p}: permission denied") from e
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror or e}") from e
    if not data:
        raise InputError(f"cannot read {p}: the file is empty (0 bytes)")
    return data


def _to_bgr_order(arr: np.ndarray) -> np.ndarray:
    """RGB -> BGR and RGBA -> BGRA (channel order only)."""
    if arr.ndim == 3 and arr.shape[2] == 3:
        return arr[..., ::-1]
    if arr.ndim == 3 and arr.shape[2] == 4:
        return arr[..., [2, 1, 0, 3]]
    return arr


def _decode_pillow(data: bytes, p: Path, kind: str | None, cv_detail: str) -> np.ndarray:
    """Decode with Pillow (formats OpenCV lacks) into OpenCV's channel order and dtypes."""
    import io as _stdio
    import warnings

    from PIL import UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Corrupt EXIF data", decompression bombs
            with _pillow_open(_stdio.BytesIO(data)) as im:
                deep = _pillow_narrows(im)
                im.load()
                orientation = im.getexif().get(0x0112)
                arr = _pillow_array(im)
    except Exception as e:  # Pillow raises many types for damaged data
        if isinstance(e, UnidentifiedImageError) and kind is None:
            raise InputError(
                f"cannot read {p}: not an image file (neither OpenCV nor Pillow recognises it)"
            ) from e
        what = f"{_KIND_NAMES[kind]} file" if kind else "image file"
        if isinstance(e, UnidentifiedImageError) or not str(e).strip():
            detail = cv_detail or type(e).__name__  # Pillow's text names a BytesIO object
        else:
            detail = str(e).strip().splitlines()[0]
        raise InputError(f"cannot read {p}: corrupt or unsupported {what} ({detail})") from e
    if deep:
        raise InputError(
            f"cannot read {p}: OpenCV could not decode it ({cv_detail or 'no details'}) "
            "and Pillow would reduce its 16-bit colour samples to 8 bits"
        )
    if not isinstance(orientation, int) or not 1 <= orientation <= 8:
        orientation = None
    return _apply_orientation(arr, orientation)


_PILLOW_LIMIT_LOCK = threading.Lock()


@contextlib.contextmanager
def _pillow_open(source: Any) -> Iterator[Any]:
    """`PIL.Image.open(source)` with Pillow's decompression-bomb limit raised to
    imgfilter's (`headers.pixel_limit`, OpenCV's): by default Pillow refuses images of
    more than about 179 million pixels (2 x its MAX_IMAGE_PIXELS), scenes that OpenCV
    reads, whose ICC profile, frame count or Pillow-only format would then be lost. The
    limit is Pillow's module setting, checked while the header is parsed, so it is
    raised for that moment only, under a lock, and put back."""
    from PIL import Image

    with _PILLOW_LIMIT_LOCK:
        default = Image.MAX_IMAGE_PIXELS
        if default is not None:
            Image.MAX_IMAGE_PIXELS = max(default, pixel_limit())
        try:
            im = Image.open(source)
        finally:
            Image.MAX_IMAGE_PIXELS = default
    with im:
        yield im


def _pillow_narrows(im: Any) -> bool:
    """Whether Pillow will decode 16-bit samples into an 8-bit mode (it has no 16-bit RGB).

    Decided from the raw modes of the not-yet-loaded image's tiles, such as "RGB;16B".
    """
    if im.mode.startswith("I") or im.mode == "F":
        return False
    for tile in im.tile or ():
        args = tile[3] if len(tile) > 3 else None
        raw = args[0] if isinstance(args, tuple) and args else args
        if isinstance(raw, str) and ";16" in raw:
            return True
    return False


def _pillow_array(im: Any) -> np.ndarray:
    """A loaded Pillow image as a numpy array in OpenCV's layout (BGR/BGRA, gray 2-D)."""
    mode = im.mode
    if mode == "1":
        im = im.convert("L")  # 0/255, as OpenCV reads 1-bit PNGs
    elif mode in ("P", "PA"):
        transparent = mode == "PA" or "transparency" in im.info
        im = im.convert("RGBA" if transparent else "RGB")
    elif mode in ("LA", "La", "RGBa"):
        im = im.convert("RGBA")
    elif mode in ("L", "RGB", "RGBA", "I", "F") or mode.startswith("I;16"):
        pass
    else:  # CMYK, YCbCr, LAB, HSV, RGBX, ...
        im = im.convert("RGBA" if "A" in mode else "RGB")
    arr = np.asarray(im)
    if arr.dtype.byteorder not in ("=", "|"):  # I;16B
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return _to_bgr_order(arr)


def _normalize(img: np.ndarray, p: Path) -> np.ndarray:
    """Bring a decoded array to (H, W) / (H, W, 3|4) and uint8/uint16/float32, losslessly."""
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    elif img.ndim == 3 and img.shape[2] == 2:  # gray + alpha -> BGRA
        img = img[:, :, [0, 0, 0, 1]]
    if img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[2] not in (3, 4)):
        raise InputError(f"cannot read {p}: unsupported image layout {img.shape}")
    dt = img.dtype
    if dt in _DTYPES:
        return img
    if dt == np.bool_:
        return img.astype(np.uint8) * np.uint8(255)
    if dt.kind in "iu":
        lo, hi = int(img.min()), int(img.max())
        if lo >= 0 and hi <= 255 and dt.itemsize == 1:
            return img.astype(np.uint8)
        if lo >= 0 and hi <= 65535:
            return img.astype(np.uint16)
        raise InputError(
            f"cannot read {p}: {dt} pixels ({lo}..{hi}) do not fit uint8 or uint16; "
            "imgfilter reads uint8, uint16 and float32 images"
        )
    if dt.kind == "f":
        f32 = img.astype(np.float32)
        if dt.itemsize <= 4 or np.array_equal(f32, img, equal_nan=True):
            return f32
        raise InputError(
            f"cannot read {p}: {dt} pixels do not fit float32 exactly; "
            "imgfilter reads uint8, uint16 and float32 images"
        )
    raise InputError(f"cannot read {p}: unsupported pixel type {dt}")


NPY_MAGIC = b"\x93NUMPY"  # the first bytes of every .npy file


def _read_npy(p: Path, data: bytes | None) -> np.ndarray:
    """A .npy image: the file `p` memory-mapped read-only (where it can be used as
    stored), or its contents `data` already read (a pipe)."""
    import io as _stdio

    try:
        if data is None:
            arr = np.load(p, mmap_mode="r", allow_pickle=False)
        else:
            arr = np.load(_stdio.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"cannot read {p}: not a valid .npy file ({detail})") from e
    if arr.size == 0:
        raise InputError(f"cannot read {p}: the array is empty (shape {arr.shape})")
    return np.ascontiguousarray(_normalize(arr, p))


def read_image(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an image file as OpenCV would.

    The dtype is uint8, uint16 or float32 as stored (16-bit PNG/TIFF stay uint16; 1-bit
    images become 0/255 uint8; other integer or float types are converted only where
    that is lossless). The result is C-contiguous and upright: EXIF orientation is
    applied exactly as ``cv2.imread(path)`` applies it, while alpha and 16-bit depth are
    kept as with ``IMREAD_UNCHANGED``. Files OpenCV cannot decode are read with Pillow.
    A file with several frames (an animated GIF, PNG or WebP, a multi-page TIFF) gives
    its first frame and a `MultiFrameWarning` that says how many there are. A NumPy
    ``.npy`` file (known by its contents) is memory-mapped read-only, not read into
    memory, when it holds a C-ordered native uint8, uint16 or float32 array of (H, W)
    or (H, W, 1|3|4); other layouts and dtypes are converted (in memory) as above.

    Args:
        path: The image file.

    Returns:
        (H, W) gray, or (H, W, 3|4) BGR/BGRA, as a NumPy array.

    Raises:
        InputError: One line naming the file, for a missing file, a directory, an empty
            file, a permission problem, a truncated or corrupt image, a file that is not
            an image, or pixels that cannot be represented losslessly.

    Example:
        >>> import imgfilter
        >>> img = imgfilter.read_image("samples/astronaut.jpg")  # BGR, upright
        >>> img.shape, img.dtype
        ((512, 512, 3), dtype('uint8'))
        >>> imgfilter.read_image("samples/rocket16.tif").dtype
        dtype('uint16')
    """
    p = Path(path)
    from . import prefetch

    img, frames, kind = prefetch.take(p) or read_frames(p)
    _note_frames(p, frames, kind)
    return img


def read_frames(p: Path) -> tuple[np.ndarray, int, str | None]:
    """`read_image`'s work without its MultiFrameWarning: (the image, the file's frames
    or pages, its kind: "png", "jpeg", "tiff", ... or None). Any thread may call it."""
    tried_tiff, found = _tiff_from_file(p)
    if found is not None:
        return found
    if _decode_from_path(p):
        return _read_from_path(p)
    data = _read_bytes(p, npy=True)
    if data is None or data.startswith(NPY_MAGIC):
        return _read_npy(p, data), 1, None
    kind = _sniff(data)
    scan = _SCANNERS[kind](data) if kind in _SCANNERS else _Scan()
    if scan.problem:
        raise InputError(f"cannot read {p}: {scan.problem}")

    img = _read_tiff_strips(p, data) if kind == "tiff" and not tried_tiff else None
    cv_detail = ""
    cv2 = _import_cv2()
    if img is None:
        img, cv_detail = _cv_call(
            cv2, lambda: cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        )
    if img is None:
        _check_pixel_limit(p, cv_detail)
        img = _decode_pillow(data, p, kind, cv_detail)
    elif kind in _SCANNERS:  # OpenCV's TIFF decoder applies TIFF orientation itself
        img = _apply_orientation(img, _exif_orientation(scan.exif))
    img = np.ascontiguousarray(_normalize(img, p))
    return img, _frame_count(data, kind), kind


def _tiff_from_file(p: Path) -> tuple[bool, tuple[np.ndarray, int, str] | None]:
    """A TIFF that `tiff.read` takes, decoded from the open file (each strip or tile
    read where it lies, not the whole file into new memory first): (whether it tried,
    `read_frames`'s result or None). (False, None) for any other file and for anything
    that goes wrong opening it (the usual path reports it)."""
    try:
        if not stat.S_ISREG(os.stat(p).st_mode):  # a pipe is read once, by the usual path
            return False, None
        with open(p, "rb") as f:
            if f.read(4) not in TIFF_MAGIC:
                return False, None
            from . import tiff  # for TIFFs only: its imports cost any other read ~10 ms

            if tiff._tiff_strips is None:
                return False, None
            img = _read_tiff_strips(p, f)
            if img is None:
                return True, None
            frames = tiff.page_count(f)
    except OSError:
        return False, None
    return True, (np.ascontiguousarray(_normalize(img, p)), frames, "tiff")


def _decode_from_path(p: Path) -> bool:
    """Whether `p` is a regular file of DECODE_FROM_PATH_BYTES or more that is not a
    .npy file (anything else, errors included, takes the usual path)."""
    try:
        if not p.is_file() or p.stat().st_size < DECODE_FROM_PATH_BYTES:
            return False
        with open(p, "rb") as f:
            return f.read(len(NPY_MAGIC)) != NPY_MAGIC
    except OSError:
        return False


def _read_from_path(p: Path) -> tuple[np.ndarray, int, str | None]:
    """`read_image` of a file of DECODE_FROM_PATH_BYTES or more: its bytes (not a
    TIFF's) read to check them and find the EXIF orientation and frames as usual, then
    dropped, and the image decoded from the path (`cv2.imread`; a TIFF that `tiff.read`
    takes never comes here: `_tiff_from_file`). Returns (image, its frames or pages,
    its kind)."""
    from . import tiff

    with open(p, "rb") as f:
        is_tiff = f.read(4) in TIFF_MAGIC
    kind, scan, frames = "tiff", _Scan(), 0
    if not is_tiff:
        data = _read_bytes(p)
        kind = _sniff(data)
        scan = _SCANNERS[kind](data) if kind in _SCANNERS else _Scan()
        if scan.problem:
            raise InputError(f"cannot read {p}: {scan.problem}")
        frames = _frame_count(data, kind)
        del data
    cv2 = _import_cv2()
    img, detail = _cv_call(cv2, lambda: cv2.imread(str(p), cv2.IMREAD_UNCHANGED))
    if img is None:
        detail = detail or "no details"
        _check_pixel_limit(p, detail)
        what = f"{_KIND_NAMES[kind]} file" if kind in _KIND_NAMES else "file"
        raise InputError(f"cannot read {p}: OpenCV could not decode this {what} ({detail})")
    if kind in _SCANNERS:  # OpenCV's TIFF decoder applies TIFF orientation itself
        img = _apply_orientation(img, _exif_orientation(scan.exif))
    img = np.ascontiguousarray(_normalize(img, p))
    if is_tiff:
        with open(p, "rb") as f:
            frames = tiff.page_count(f)
    return img, frames, kind


def _read_tiff_strips(p: Path, source: Any) -> np.ndarray | None:
    """The TIFF `p` (its bytes, or the open file) decoded by `tiff.read` (the pixels
    OpenCV gives; its strips on a pool of threads from TIFF_THREADS_MIN_BYTES, on this
    thread below); None for a layout that reader does not take (OpenCV decodes those).
    InputError for damaged strips, which OpenCV would decode to wrong rows."""
    from . import tiff

    size = len(source) if isinstance(source, bytes) else os.fstat(source.fileno()).st_size
    try:
        return tiff.read(source, threads=None if size >= TIFF_THREADS_MIN_BYTES else 1)
    except tiff.DamagedTiff as e:
        raise InputError(f"cannot read {p}: damaged TIFF ({e})") from None
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror or e}") from None


def _cv_call(cv2: Any, call: Callable[[], Any]) -> tuple[Any, str]:
    """(call()'s result, "") with OpenCV's chatter captured, or (None, the line that
    says why: the cv2.error's last line, else the last line OpenCV printed)."""
    detail = ""
    with _quiet_native(cv2) as noise:
        try:
            return call(), ""
        except cv2.error as e:
            detail = str(e).strip().splitlines()[-1] if str(e).strip() else ""
    return None, detail or noise.last_line()


def _note_frames(p: Path, frames: int, kind: str | None) -> None:
    """The MultiFrameWarning of a file read as its first of `frames` frames or pages."""
    if frames > 1:
        what = "pages" if kind == "tiff" else "frames"
        warnings.warn(f"{p} has {frames} {what}; reading the first", MultiFrameWarning,
                      stacklevel=3)  # fmt: skip


def _check_pixel_limit(p: Path, detail: str) -> None:
    """InputError naming OpenCV's pixel limit when that is why it could not decode."""
    if "CV_IO_MAX_IMAGE_PIXELS" not in detail:
        return
    import imgfilter

    if imgfilter._opencv_loaded_first:
        why = ("cv2 was imported before imgfilter and keeps its limit of 2^30: import "
               "imgfilter first, or set OPENCV_IO_MAX_IMAGE_PIXELS before either")  # fmt: skip
    else:
        limit = os.environ.get("OPENCV_IO_MAX_IMAGE_PIXELS")
        why = f"OPENCV_IO_MAX_IMAGE_PIXELS={limit}: set it higher before cv2 is imported"
    raise InputError(f"cannot read {p}: it has more pixels than OpenCV decodes ({why})")


class MultiFrameWarning(UserWarning):
    """`read_image` read the first frame of a file that holds several (an animated GIF,
    PNG or WebP, a multi-page TIFF). The CLI shows it as one line on stderr."""

    cli_note = True  # imgfilter.cli prints warnings with this attribute as one line


def _may_have_frames(data: bytes, kind: str | None) -> bool:
    """Whether the file can hold more than one frame (cheap checks on the bytes)."""
    if kind in ("gif", "tiff"):
        return True
    if kind == "png":  # APNG: an acTL chunk before the first IDAT
        idat = data.find(b"IDAT")
        actl = data.find(b"acTL")
        return actl >= 0 and (idat < 0 or actl < idat)
    if kind == "webp":  # animated WebP: VP8X with its animation flag (0x02)
        return data[12:16] == b"VP8X" and len(data) > 20 and bool(data[20] & 0x02)
    return False


def _frame_count(data: bytes, kind: str | None) -> int:
    """How many frames Pillow finds in the file (a TIFF's pages: `tiff.page_count`);
    1 when in doubt."""
    if not _may_have_frames(data, kind):
        return 1
    import io as _stdio

    if kind == "tiff":
        from . import tiff

        return tiff.page_count(_stdio.BytesIO(data))

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with _pillow_open(_stdio.BytesIO(data)) as im:
                return int(getattr(im, "n_frames", 1))
    except Exception:  # a file Pillow cannot parse was read by OpenCV: one frame
        return 1


# ---------------------------------------------------------------------------------------
# What each output format can hold


@dataclass(frozen=True)
class _Format:
    name: str
    dtypes: tuple[str, ...]
    channels: tuple[int, ...]
    depth_text: str  # "8-bit images", for messages


_JPEG = _Format("JPEG", ("uint8",), (1, 3), "8-bit images")
_PNG = _Format("PNG", ("uint8", "uint16"), (1, 3, 4), "8- and 16-bit integer images")
_TIFF = _Format("TIFF", ("uint8", "uint16", "float32"), (1, 3, 4), "")
_BMP = _Format("BMP", ("uint8",), (1, 3, 4), "8-bit images")
_WEBP = _Format("WebP", ("uint8",), (1, 3, 4), "8-bit images")
_NPY = _Format("NumPy", ("uint8", "uint16", "float32"), (1, 3, 4), "")

_FORMATS: dict[str, _Format] = {
    ".jpg": _JPEG,
    ".jpeg": _JPEG,
    ".png": _PNG,
    ".tif": _TIFF,
    ".tiff": _TIFF,
    ".bmp": _BMP,
    ".webp": _WEBP,
    ".npy": _NPY,
}
SUPPORTED_WRITE_EXTENSIONS: tuple[str, ...] = tuple(_FORMATS)
"""Extensions write_image accepts (compared case-insensitively)."""

# Order in which other extensions are suggested when one cannot hold an image.
_SUGGESTED = (".png", ".tiff", ".webp", ".bmp", ".jpg")


def _channels_supported(fmt: _Format) -> tuple[int, ...]:
    """Channel counts `fmt` round-trips with the installed OpenCV.

    OpenCV without IMWRITE_BMP_COMPRESSION (4.8, for one) writes 4-channel BMP as 32-bit
    BI_RGB, whose fourth byte readers (OpenCV's own included) ignore: the alpha channel
    is lost. Versions with it (5.0) write BI_BITFIELDS with an alpha mask.
    """
    if fmt is _BMP and not hasattr(_import_cv2(), "IMWRITE_BMP_COMPRESSION_BITFIELDS"):
        return (1, 3)
    return fmt.channels


def _holds(ext: str, dtype: np.dtype, channels: int | None) -> bool:
    fmt = _FORMATS[ext]
    return dtype.name in fmt.dtypes and (channels is None or channels in _channels_supported(fmt))


def _alternatives(dtype: np.dtype, channels: int | None) -> str:
    exts = [e for e in _SUGGESTED if _holds(e, dtype, channels)]
    return " or ".join([", ".join(exts[:-1]), exts[-1]] if len(exts) > 1 else exts)


def _check_holds(p: Path, fmt: _Format, dtype: Any, channels: int | None) -> None:
    """OutputError unless `fmt` can store images of `dtype` with `channels` losslessly."""
    dt = None if dtype is None else np.dtype(dtype)
    if dt is not None and dt not in _DTYPES:
        raise OutputError(
            f"cannot write {p}: {dt} images cannot be written; "
            "convert to uint8, uint16 or float32 first"
        )
    if channels is not None and channels not in (1, 3, 4):
        raise OutputError(
            f"cannot write {p}: {channels}-channel images cannot be written (1, 3 or 4 channels)"
        )
    if dt is not None and dt.name not in fmt.dtypes:
        raise OutputError(
            f"cannot write {p}: {fmt.name} holds {fmt.depth_text} only; "
            f"write {_alternatives(dt, channels)} for {dt}"
        )
    held = fmt.channels if channels is None else _channels_supported(fmt)
    if channels is not None and channels not in held:
        held_text = "- or ".join(str(c) for c in held)
        extra = "" if held == fmt.channels else " with this OpenCV version"
        raise OutputError(
            f"cannot write {p}: {fmt.name} holds {held_text}-channel images only{extra}; "
            f"write {_alternatives(dt or np.dtype(np.uint8), channels)} for {channels} channels"
        )


# ---------------------------------------------------------------------------------------
# Output paths


def default_output(input_path: str | os.PathLike[str], op: str) -> Path:
    """``IN_STEM.<op>.EXT`` beside the input: photo.jpg + "blur" -> photo.blur.jpg.

    An input whose extension cannot be written (say .gif) gets .png instead.
    """
    p = Path(input_path)
    suffix = p.suffix if p.suffix.lower() in _FORMATS else ".png"
    return p.with_name(f"{p.stem}.{op}{suffix}")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return os.path.realpath(a) == os.path.realpath(b)


def _real_target(p: Path) -> Path:
    """Where bytes for `p` land: a symlink is followed, so the link itself survives."""
    return Path(os.path.realpath(p)) if p.is_symlink() else p


def check_path(p: Path, *, input_path: Any, overwrite: bool) -> None:
    """OutputError unless `p` can be created or (with overwrite) replaced."""
    target = _real_target(p)
    if target.is_dir():
        raise OutputError(f"cannot write {p}: it is a directory")
    parent = target.parent
    if not parent.exists():
        raise OutputError(f"cannot write {p}: directory {parent} does not exist")
    if not parent.is_dir():
        raise OutputError(f"cannot write {p}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {p}: directory {parent} is not writable")
    if input_path is not None and not overwrite and _same_file(p, Path(input_path)):
        raise OutputError(
            f"would overwrite the input {input_path}; pass overwrite=True to replace it",
            cli_message=f"would overwrite the input {input_path}; pass --force to overwrite it",
        )
    if os.path.lexists(p) and not overwrite:
        raise _exists(p)


def _exists(p) -> OutputError:
    return OutputError(
        f"{p} exists; pass overwrite=True to replace it",
        cli_message=f"{p} exists; pass --force to overwrite",
    )


def is_npy_path(p: Path) -> bool:
    """Whether `p`'s extension selects a NumPy .npy file (any case)."""
    return p.suffix.lower() == ".npy"


def format_for(p: Path) -> _Format:
    """The output format `p`'s extension selects (its `.name`: png, jpeg, tiff...);
    OutputError for "-", a directory or an extension imgfilter cannot write."""
    if str(p) == "-":
        raise OutputError("cannot write to standard output (-): give an output file name")
    if p.is_dir():
        raise OutputError(f"cannot write {p}: it is a directory; give a file name inside it")
    ext = p.suffix.lower()
    if ext not in _FORMATS:
        shown = f"extension {p.suffix!r}" if p.suffix else "no extension"
        raise OutputError(
            f"cannot write {p}: {shown} is not a supported image format; "
            f"use one of {', '.join(SUPPORTED_WRITE_EXTENSIONS)}"
        )
    return _FORMATS[ext]


def check_output(
    path: str | os.PathLike[str],
    *,
    input_path: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    dtype: Any = None,
    channels: int | None = None,
    quality: int | None = None,
) -> Path:
    """Validate an output path before any work is done; return it as a Path.

    Checks, in order: the extension is one of SUPPORTED_WRITE_EXTENSIONS; the format can
    hold `dtype` and `channels` losslessly (each checked when given); the target is not
    a directory; its directory exists and is writable; it is not the same file as
    `input_path` (unless `overwrite`); it does not exist yet (unless `overwrite`).
    Raises OutputError with one line naming the problem and, where one exists, a fix,
    and UsageError for a `quality` that is not 0..100 or given for a format other than
    JPEG and WebP.
    """
    p = check_format(path, dtype=dtype, channels=channels, quality=quality)
    check_path(p, input_path=input_path, overwrite=overwrite)
    return p


def check_format(
    path: str | os.PathLike[str],
    *,
    dtype: Any = None,
    channels: int | None = None,
    quality: int | None = None,
) -> Path:
    """The first checks of `check_output` only: the extension is a format that can hold
    `dtype` and `channels` (each checked when given) and takes `quality`. Nothing about
    the file system (its directory may not exist yet)."""
    p = Path(path)
    fmt = format_for(p)
    _check_quality(p, fmt, quality)
    _check_holds(p, fmt, dtype, channels)
    return p


# ---------------------------------------------------------------------------------------
# Metadata: EXIF and ICC profiles carried from an input to an output


@dataclass(frozen=True)
class ImageMetadata:
    """What `read_metadata` found: the EXIF block (TIFF-structured, without the
    "Exif\\0\\0" prefix) and the ICC profile, each None when absent."""

    exif: bytes | None = None
    icc: bytes | None = None

    def __bool__(self) -> bool:
        return bool(self.exif or self.icc)


def read_metadata(path: str | os.PathLike[str]) -> ImageMetadata:
    """The EXIF block of a JPEG, PNG or WebP file and the ICC profile of any file Pillow
    opens (JPEG, PNG, WebP, TIFF), for `write_image(..., metadata=)`. A regular file is
    read through a memory map (a raster's pixels are not copied into memory again).

    Raises InputError as `read_image` does for a file that cannot be read; a file whose
    metadata cannot be parsed gives an empty ImageMetadata.
    """
    p = Path(path)
    mapped = _map_file(p)
    data = mapped if mapped is not None else _read_bytes(p)
    try:
        if data[: len(NPY_MAGIC)] == NPY_MAGIC:
            return ImageMetadata(exif=None, icc=None)
        exif = _exif_of(data)
        icc = None
        import io as _stdio

        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with _pillow_open(p if mapped is not None else _stdio.BytesIO(data)) as im:
                icc = im.info.get("icc_profile") or None
    finally:
        if mapped is not None:
            with contextlib.suppress(BufferError):  # a view still open: closed when freed
                mapped.close()
    return ImageMetadata(exif=exif, icc=icc if isinstance(icc, bytes) else None)


def _map_file(p: Path) -> mmap.mmap | None:
    """A read-only memory map of `p` if it is a regular, non-empty file (its pages are
    read as they are touched), else None (a pipe, an empty or unreadable file: the
    caller reads it the usual way, which reports what is wrong)."""
    try:
        if not stat.S_ISREG(os.stat(p).st_mode):  # a pipe is not opened: read once, later
            return None
        with open(p, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return None


def _exif_of(data: Any) -> bytes | None:
    """The EXIF block (a TIFF structure) of a JPEG, PNG or WebP file's bytes, or None."""
    kind = _sniff(data[:16])
    if kind not in _SCANNERS:
        return None
    exif = _SCANNERS[kind](data, whole=False).exif
    if exif is not None and exif[:6] == b"Exif\x00\x00":
        exif = exif[6:]
    if exif is None or exif[:2] not in (b"II", b"MM"):
        return None  # not a TIFF structure: nothing a reader could use
    return bytes(exif)


# Formats `write_image` can put metadata into.
METADATA_FORMATS = ("JPEG", "PNG", "WebP")


def _exif_upright(payload: bytes) -> bytes:
    """The EXIF block with its Orientation tag (if any) set to 1: `read_image` has
    applied the orientation to the pixels already."""
    if len(payload) < 8 or payload[:2] not in (b"II", b"MM"):
        return payload
    e = "<" if payload[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(e + "I", payload, 4)
    if ifd + 2 > len(payload):
        return payload
    (count,) = struct.unpack_from(e + "H", payload, ifd)
    out = bytearray(payload)
    for i in range(count):
        entry = ifd + 2 + 12 * i
        if entry + 12 > len(payload):
            break
        tag, typ = struct.unpack_from(e + "HH", payload, entry)
        if tag == 0x0112 and typ in (3, 4):
            struct.pack_into(e + ("H" if typ == 3 else "I"), out, entry + 8, 1)
    return bytes(out)


def _with_jpeg_metadata(data: bytes, meta: ImageMetadata) -> bytes:
    """Insert APP1 (Exif) and APP2 (ICC_PROFILE) segments after SOI and a JFIF APP0."""
    segments = b""
    if meta.exif and len(meta.exif) <= 65533 - 8:
        body = b"Exif\x00\x00" + _exif_upright(meta.exif)
        segments += b"\xff\xe1" + struct.pack(">H", len(body) + 2) + body
    if meta.icc:
        size = 65533 - 14
        chunks = [meta.icc[i : i + size] for i in range(0, len(meta.icc), size)]
        if len(chunks) <= 255:
            for n, chunk in enumerate(chunks, 1):
                body = b"ICC_PROFILE\x00" + bytes((n, len(chunks))) + chunk
                segments += b"\xff\xe2" + struct.pack(">H", len(body) + 2) + body
    pos = 2
    if data[2:4] == b"\xff\xe0":  # JFIF APP0 stays first
        pos = 4 + struct.unpack_from(">H", data, 4)[0]
    return data[:pos] + segments + data[pos:]


def _png_chunk(ctype: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(ctype + body)
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", crc)


def _with_png_metadata(data: bytes, meta: ImageMetadata) -> bytes:
    """Insert iCCP and eXIf chunks right after IHDR (both must precede IDAT)."""
    chunks = b""
    if meta.icc:
        chunks += _png_chunk(b"iCCP", b"ICC profile\x00\x00" + zlib.compress(meta.icc))
    if meta.exif:
        chunks += _png_chunk(b"eXIf", _exif_upright(meta.exif))
    end_of_ihdr = 8 + 12 + struct.unpack_from(">I", data, 8)[0]
    return data[:end_of_ihdr] + chunks + data[end_of_ihdr:]


def _riff_chunk(fourcc: bytes, body: bytes) -> bytes:
    return fourcc + struct.pack("<I", len(body)) + body + (b"\x00" if len(body) & 1 else b"")


def _with_webp_metadata(data: bytes, meta: ImageMetadata) -> bytes:
    """The extended (VP8X) form with an ICCP chunk first and an EXIF chunk last."""
    first = data[12:16]
    body = data[12:]
    if first == b"VP8X":
        flags = data[20]
        header = bytearray(data[12:30])
        rest = data[30:]
    else:
        flags = 0
        if first == b"VP8L":  # 0x2f, then width-1 (14 bits), height-1, alpha_is_used
            (bits,) = struct.unpack_from("<I", data, 21)
            w, h = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
            flags |= 0x10 if (bits >> 28) & 1 else 0
        elif first == b"VP8 ":  # frame tag (3), start code (3), width, height (14 bits each)
            w, h = (v & 0x3FFF for v in struct.unpack_from("<HH", data, 26))
        else:
            return data
        header = bytearray(
            _riff_chunk(
                b"VP8X", bytes(4) + (w - 1).to_bytes(3, "little") + (h - 1).to_bytes(3, "little")
            )
        )
        rest = body
    if meta.icc:
        flags |= 0x20
    if meta.exif:
        flags |= 0x08
    header[8] = flags
    out = bytes(header)
    if meta.icc:
        out += _riff_chunk(b"ICCP", meta.icc)
    out += rest
    if meta.exif:
        out += _riff_chunk(b"EXIF", _exif_upright(meta.exif))
    return b"RIFF" + struct.pack("<I", 4 + len(out)) + b"WEBP" + out


def _with_metadata(fmt: _Format, data: Contents, meta: ImageMetadata | None) -> Contents:
    if not meta:
        return data
    if fmt is _JPEG:
        return _with_jpeg_metadata(data, meta)
    if fmt is _PNG:
        return _with_png_metadata(data, meta)
    if fmt is _WEBP:
        return _with_webp_metadata(data, meta)
    return data  # TIFF, BMP: not carried


# ---------------------------------------------------------------------------------------
# Writing


def _check_quality(p: Path, fmt: _Format, quality: Any) -> int | None:
    """`quality` as an int 0..100, or UsageError; None stays None (the default)."""
    if quality is None:
        return None
    if isinstance(quality, bool) or not isinstance(quality, (int, np.integer)):
        raise UsageError(f"quality must be an integer from 0 to 100, got {quality!r}")
    if not 0 <= int(quality) <= 100:
        raise UsageError(
            f"quality must be from 0 to 100, got {quality}",
            cli_message=f"--quality must be from 0 to 100, got {quality}",
        )
    if fmt not in (_JPEG, _WEBP):
        raise UsageError(
            f"quality applies to JPEG and WebP outputs, not {fmt.name} ({p})",
            cli_message=f"--quality applies to JPEG and WebP outputs, not {fmt.name} ({p})",
        )
    return int(quality)


def _encode(p: Path, fmt: _Format, img: np.ndarray, quality: int | None = None) -> Contents:
    """The encoded file contents, or OutputError. `quality` (checked): JPEG quality, or
    lossy WebP at that quality. A .npy file, and a TIFF of `tiff.BIGTIFF_MIN_BYTES`
    or more (a BigTIFF), are not encoded in memory: their contents are a function that
    writes them into the open file (`atomic_write`)."""
    if fmt is _NPY:
        return functools.partial(np.lib.format.write_array, array=img, allow_pickle=False)
    if fmt is _TIFF:
        from . import tiff

        if img.nbytes >= tiff.BIGTIFF_MIN_BYTES:  # past what classic TIFF may hold
            return functools.partial(tiff.write, img=img)
    cv2 = _import_cv2()
    params: list[int] = []
    channels = 1 if img.ndim == 2 else img.shape[2]
    if fmt is _JPEG:
        params = [cv2.IMWRITE_JPEG_QUALITY, 95 if quality is None else quality]
    elif fmt is _WEBP and quality is not None:
        params = [cv2.IMWRITE_WEBP_QUALITY, max(1, quality)]  # libwebp's lowest is 1
    elif fmt is _TIFF:
        # Explicit, or OpenCV < 5 stores float32 BGR as lossy LogLuv (SGILOG).
        params = [cv2.IMWRITE_TIFF_COMPRESSION, 5]  # LZW
    elif fmt is _BMP and channels == 4:
        params = [cv2.IMWRITE_BMP_COMPRESSION, cv2.IMWRITE_BMP_COMPRESSION_BITFIELDS]
    elif fmt is _WEBP:
        if hasattr(cv2, "IMWRITE_WEBP_LOSSLESS_PRESERVE_COLOR"):
            # Lossless that keeps the colour under fully transparent pixels too.
            params = [cv2.IMWRITE_WEBP_LOSSLESS_MODE, cv2.IMWRITE_WEBP_LOSSLESS_PRESERVE_COLOR]
        elif channels == 4:
            return _encode_webp_pillow(p, img)
        else:
            params = [cv2.IMWRITE_WEBP_QUALITY, 101]  # lossless
    encoded, detail = _cv_call(cv2, lambda: cv2.imencode(p.suffix.lower(), img, params))
    ok, buf = encoded or (False, None)
    if not ok or buf is None:
        detail = detail or "no details"
        raise OutputError(f"cannot write {p}: OpenCV could not encode it as {fmt.name} ({detail})")
    return buf.tobytes()


def _encode_webp_pillow(p: Path, img: np.ndarray) -> bytes:
    """Lossless WebP with alpha via Pillow (exact=True keeps colour under alpha 0)."""
    import io as _stdio

    from PIL import Image

    out = _stdio.BytesIO()
    try:
        Image.fromarray(np.ascontiguousarray(img[..., [2, 1, 0, 3]])).save(
            out, "WEBP", lossless=True, exact=True
        )
    except Exception as e:  # e.g. Pillow built without WebP
        raise OutputError(f"cannot write {p}: Pillow could not encode it as WebP ({e})") from e
    return out.getvalue()


def _create_temp(directory: Path, name: str) -> tuple[int, Path]:
    """A new file beside the target; created 0o666 & ~umask like any new file.

    It is listed in `_temp_files` (for `abandon_io`) until `_forget_temp`; after
    `abandon_io` no temporary file is created.
    """
    # Read and write: a .npy written through a memory map (`write_npy_from`) needs both.
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = directory / f".{name}.{os.urandom(4).hex()}.tmp"
        with _held_lock:
            if _abandoned:
                raise OSError(errno.ECANCELED, "interrupted")
            try:
                fd = os.open(tmp, flags, 0o666)
            except FileExistsError:
                continue
            _temp_files.add(tmp)
            return fd, tmp


def _forget_temp(tmp: Path) -> None:
    with _held_lock:
        _temp_files.discard(tmp)


def _publish(tmp: Path, target: Path, *, overwrite: bool, shown: Path) -> None:
    """Move the finished temp file onto `target`; without overwrite, never clobber."""
    if overwrite:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)  # atomic and fails if target appeared since the check
    except FileExistsError as e:
        raise _exists(shown) from e
    except OSError:  # no hard links on this file system
        if os.path.lexists(target):
            raise _exists(shown) from None
        os.replace(tmp, target)
        return
    os.unlink(tmp)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable (POSIX); a no-op where directories cannot be opened."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class DirectorySync:
    """Directories whose new entries `flush` makes durable, each once.

    A batch of `write_image` calls given one DirectorySync fsyncs each output folder
    once, at `flush`, instead of after every file. Each file's bytes are still fsynced
    before its rename, so a file is whole or absent whatever happens; until `flush`,
    a power cut may lose renames (a process that dies loses nothing). Thread-safe.

    Example:
        >>> import numpy as np
        >>> import imgfilter
        >>> from imgfilter.io import DirectorySync
        >>> synced = DirectorySync()
        >>> for name in ("a.png", "b.png"):
        ...     _ = imgfilter.write_image(name, np.zeros((8, 8), np.uint8), overwrite=True,
        ...                               directories=synced)
        >>> synced.flush()  # the folder, once
    """

    def __init__(self) -> None:
        self._pending: set[Path] = set()
        self._lock = threading.Lock()

    def add(self, directory: Path) -> None:
        """Sync `directory` at the next `flush`."""
        with self._lock:
            self._pending.add(directory)

    def flush(self) -> None:
        """fsync every directory added since the last flush."""
        with self._lock:
            pending, self._pending = self._pending, set()
        for directory in sorted(pending):
            _fsync_directory(directory)


def atomic_write(
    p: Path,
    data: Contents,
    *,
    overwrite: bool,
    directories: DirectorySync | None = None,
) -> None:
    """Write `data` (bytes, or a function that writes into the open file) to `p`
    through a temp file in the same directory and a rename; the directory is fsynced
    now, or left to `directories.flush()` when given."""
    target = _real_target(p)
    mode = None
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(os.stat(target).st_mode)  # keep an existing file's mode
    try:
        fd, tmp = _create_temp(target.parent, target.name)
    except OSError as e:
        raise OutputError(f"cannot write {p}: {e.strerror or e}") from e
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        _publish(tmp, target, overwrite=overwrite, shown=p)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise OutputError(f"cannot write {p}: {e.strerror or e}") from e
        raise
    finally:
        _forget_temp(tmp)
    if directories is None:
        _fsync_directory(target.parent)
    else:
        directories.add(target.parent)


def write_image(
    path: str | os.PathLike[str],
    img: np.ndarray,
    *,
    overwrite: bool = False,
    quality: int | None = None,
    metadata: ImageMetadata | None = None,
    directories: DirectorySync | None = None,
) -> Path:
    """Write an image to a file whose extension picks the format.

    The format follows the extension (SUPPORTED_WRITE_EXTENSIONS, any case). Images the
    format cannot hold without loss (say uint16 as JPEG, or BGRA as JPEG) are refused;
    see `imgfilter.io` for what each format holds. The write is atomic: on any failure
    an existing file at `path` is left as it was and no temporary file remains.

    Args:
        path: The file to write.
        img: (H, W) gray or (H, W, 3|4) BGR/BGRA (an (H, W, 1) image is written as
            gray), non-empty.
        overwrite: Replace an existing file; without it an existing file is refused.
        quality: 0-100, JPEG and WebP only: JPEG quality (default 95), or lossy WebP at
            that quality (default: lossless).
        metadata: From `read_metadata`: EXIF and ICC profile put into JPEG, PNG and WebP
            files (orientation reset to 1); TIFF and BMP files are written without them.
        directories: A `DirectorySync` that makes the file's directory entry durable
            later, once for a whole batch (default: fsync the directory now).

    Returns:
        The Path written.

    Raises:
        OutputError: An image the format cannot hold without loss (the message suggests
            an extension that can hold it), an image that is not (H, W) or (H, W, C) or
            is empty, an extension imgfilter cannot write, a missing or unwritable
            directory, a directory as target, and an existing file unless `overwrite`
            (the same checks as `check_output`).
        UsageError: A `quality` that is not an integer from 0 to 100, or one given for a
            format other than JPEG and WebP.

    Example:
        >>> import numpy as np
        >>> import imgfilter
        >>> img = np.zeros((64, 64, 3), np.uint8)
        >>> imgfilter.write_image("out.png", img, overwrite=True).name
        'out.png'
        >>> imgfilter.write_image("out.jpg", img, quality=90, overwrite=True).suffix
        '.jpg'
    """
    p = Path(path)
    fmt = format_for(p)
    arr = np.asarray(img)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim not in (2, 3) or arr.size == 0:
        raise OutputError(
            f"cannot write {p}: an image must be (H, W) or (H, W, C) and non-empty, "
            f"got shape {arr.shape}"
        )
    channels = 1 if arr.ndim == 2 else int(arr.shape[2])
    q = _check_quality(p, fmt, quality)
    _check_holds(p, fmt, arr.dtype, channels)
    check_path(p, input_path=None, overwrite=overwrite)
    data = _with_metadata(fmt, _encode(p, fmt, np.ascontiguousarray(arr), q), metadata)
    atomic_write(p, data, overwrite=overwrite, directories=directories)
    return p


def write_npy_from(
    path: str | os.PathLike[str],
    shape: tuple[int, ...],
    dtype: Any,
    fill: Callable[[np.ndarray], Any],
    *,
    overwrite: bool = False,
) -> Path:
    """Write a .npy image whose values `fill` writes straight into the new file.

    `fill(array)` gets a writable (H, W) or (H, W, C) C-ordered array of `shape` and
    `dtype` that is a memory map of the file being written (pass it as a filter's
    `out=`): a result larger than the host's memory never has to be held in it.
    Atomic as `write_image`: the file appears at `path` complete (flushed and
    fsynced) or not at all; an exception from `fill` removes the temporary file and
    propagates.

    Args:
        path: The .npy file to write.
        shape: (H, W) or (H, W, C), C in {1, 3, 4}, non-empty.
        dtype: uint8, uint16 or float32.
        fill: Writes every value of the array it is given.
        overwrite: Replace an existing file; without it an existing file is refused.

    Returns:
        The Path written.

    Raises:
        OutputError: Not a .npy path, a shape or dtype a .npy image cannot have, a
            missing or unwritable directory, a directory as target, an existing
            file unless `overwrite`.
    """
    p = Path(path)
    if format_for(p) is not _NPY:
        raise OutputError(f"cannot write {p}: write_npy_from writes .npy files only")
    dt = np.dtype(dtype)
    if len(shape) not in (2, 3) or 0 in shape:
        raise OutputError(
            f"cannot write {p}: an image must be (H, W) or (H, W, C) and non-empty, "
            f"got shape {tuple(shape)}"
        )
    _check_holds(p, _NPY, dt, 1 if len(shape) == 2 else int(shape[2]))
    check_path(p, input_path=None, overwrite=overwrite)
    atomic_write(p, functools.partial(_fill_npy, tuple(shape), dt, fill), overwrite=overwrite)
    return p


def _fill_npy(shape: tuple[int, ...], dtype: np.dtype, fill: Callable[[np.ndarray], Any],
              f: BinaryIO) -> None:  # fmt: skip
    """Into the open, empty file f: a .npy header, then `fill` of a memory map of the
    data that follows it, flushed to the file."""
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
              "shape": shape}  # fmt: skip
    np.lib.format.write_array_header_1_0(f, header)
    f.flush()
    array = np.memmap(f, dtype=dtype, mode="r+", offset=f.tell(), shape=shape)
    fill(array)
    array.flush()
