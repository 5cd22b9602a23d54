"""Reading an image file as OpenCV would, with the checks OpenCV lacks.

`read_frames` (behind `imgfilter.io.read_image`) opens only regular files (a FIFO or a
device is refused at once: reading one could wait forever). The file is read once and
decoded with ``cv2.imdecode(IMREAD_UNCHANGED)``, which keeps 16-bit samples and alpha but
skips EXIF orientation, which ``cv2.imread(path)`` applies; so the orientation tag of
JPEG, PNG and WebP files (read from the EXIF block found while checking the file,
`io_pillow.exif_orientation`) is applied here with numpy, giving the pixels
``cv2.imread`` gives. (OpenCV's TIFF decoder applies the TIFF orientation tag itself.)
The file's bytes are read with one system call (the GIL let go meanwhile), and the
checks of an intact JPEG look at its headers and its last bytes only.

Checked before decoding, because OpenCV does not: a JPEG cut short (OpenCV 4.8 turns it
into a whole image with a grey bottom and only prints a warning), a PNG chunk with a bad
checksum (Pillow, the fallback decoder, does not check IDAT's), a truncated PNG or WebP,
and a PNG whose header claims more pixels than its image data could hold (a
decompression bomb: refused from its header, before anything is allocated).

TIFFs that `imgfilter.tiff.read` takes are decoded by tifffile from the open file (on a
pool of threads from TIFF_THREADS_MIN_BYTES); their damaged strips or tiles are an error.
Files of DECODE_FROM_PATH_BYTES (1 GiB) or more are decoded from their path
(``cv2.imread``) after the same checks of their bytes: OpenCV decodes no buffer of 2 GiB
or more. Smaller files OpenCV cannot decode go to Pillow (`io_pillow`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .errors import InputError
from .headers import TIFF_MAGIC
from .io_formats import DTYPES
from .io_native import cv2_loaded_first, cv_call, import_cv2
from .io_pillow import KIND_NAMES, decode, exif_orientation, frame_count

# Files this large are decoded from their path: cv2.imdecode takes no buffer of 2 GiB
# or more (its length is an int) and its TIFF reader fails to seek past 4 GiB; and the
# file's bytes need not be held beside the image.
DECODE_FROM_PATH_BYTES = 1 << 30
# TIFFs that `imgfilter.tiff.read` takes are decoded on a pool of threads from this size
# (OpenCV decodes on one thread), on the calling thread below it.
TIFF_THREADS_MIN_BYTES = 16 << 20
NPY_MAGIC = b"\x93NUMPY"  # the first bytes of every .npy file
# Deflate codes at most 258 bytes in 2 bits (a ratio of 1032): image data of fewer bytes
# than 1/DEFLATE_MAX_RATIO of the header's pixels cannot be a whole image.
DEFLATE_MAX_RATIO = 1032


class MultiFrameWarning(UserWarning):
    """`read_image` read the first frame of a file that holds several (an animated GIF,
    PNG or WebP, a multi-page TIFF). The CLI shows it as one line on stderr."""

    cli_note = True  # imgfilter.cli prints warnings with this attribute as one line


def sniff(data: bytes) -> str | None:
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


def _scan_jpeg(d: bytes) -> _Scan:
    """Walk the JPEG marker segments up to the first scan; the scan must end with EOI.

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
            if d.rfind(b"\xff\xd9", end) < 0:  # from the end: an intact file ends with it
                return _Scan("truncated JPEG (no end-of-image marker)", exif)
            return _Scan(None, exif)
        pos = end


# PNG colour type -> samples per pixel
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _scan_png(d: bytes) -> _Scan:
    """Walk the PNG chunks; a complete file reaches IEND. Collects the eXIf chunk.

    The CRC of each critical chunk (IHDR, PLTE, IDAT, IEND) is checked, as libpng does:
    Pillow, the fallback decoder, does not check IDAT's, and would return garbage. The
    IDAT chunks together must be able to hold the pixels IHDR claims (DEFLATE_MAX_RATIO).
    """
    n, pos, exif, idat = len(d), 8, None, 0
    view = memoryview(d)
    while True:
        if pos + 8 > n:
            return _Scan("truncated PNG (no IEND chunk)", exif)
        length, ctype = struct.unpack_from(">I4s", d, pos)
        end = pos + 12 + length
        if end > n:
            return _Scan("truncated PNG (the file ends inside a chunk)", exif)
        if not ctype[0] & 0x20:  # critical chunk: upper-case first letter
            (crc,) = struct.unpack_from(">I", d, end - 4)
            if zlib.crc32(view[pos + 4 : end - 4]) != crc:
                name = ctype.decode("latin-1", "replace")
                return _Scan(f"corrupt PNG (checksum mismatch in its {name} chunk)", exif)
        if ctype == b"IDAT":
            idat += length
        if ctype == b"eXIf" and exif is None:
            exif = d[pos + 8 : pos + 8 + length]
        if ctype == b"IEND":
            return _Scan(_png_bomb(d, idat), exif)
        pos = end


def _png_bomb(d: bytes, idat: int) -> str | None:
    """Why a PNG whose IDAT chunks hold `idat` bytes cannot hold the image its IHDR
    claims (None where it can)."""
    if d[12:16] != b"IHDR" or len(d) < 26:
        return None
    w, h, depth, colour = struct.unpack_from(">IIBB", d, 16)
    pixels = w * h * _PNG_SAMPLES.get(colour, 1) * depth // 8
    if idat * DEFLATE_MAX_RATIO >= pixels:
        return None
    return (f"corrupt PNG (its header claims {w}x{h} pixels, more than its {idat} bytes of "
            "image data can hold)")  # fmt: skip


def _scan_webp(d: bytes) -> _Scan:
    """Check the RIFF size against the file size; collects the EXIF chunk."""
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


def _checked(p: Path, data: bytes, kind: str | None) -> _Scan:
    """The scan of a JPEG, PNG or WebP file's bytes; InputError for a problem it found."""
    scan = _SCANNERS[kind](data) if kind in _SCANNERS else _Scan()
    if scan.problem:
        raise InputError(f"cannot read {p}: {scan.problem}")
    return scan


def apply_orientation(img: np.ndarray, orientation: int | None) -> np.ndarray:
    """Turn stored pixels upright per EXIF orientation 1..8, as OpenCV's imread does (and
    `PIL.ImageOps.exif_transpose`, for an array of any dtype and channels)."""
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


@contextlib.contextmanager
def open_input(p: Path) -> Iterator[BinaryIO]:
    """`p` opened for reading in binary mode, or InputError for a missing, unreadable or
    empty file, a directory, and anything that is not a regular file (a FIFO, a device:
    opened without waiting for a writer, and refused)."""
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
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
    st = os.fstat(fd)
    problem = None
    if stat.S_ISDIR(st.st_mode):
        problem = "it is a directory, not an image file"
    elif not stat.S_ISREG(st.st_mode):
        problem = "not a regular file (a pipe or a device)"
    elif st.st_size == 0:
        problem = "the file is empty (0 bytes)"
    if problem is not None:
        os.close(fd)
        raise InputError(f"cannot read {p}: {problem}")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as f:
        yield f


def normalize(img: np.ndarray, p: Path) -> np.ndarray:
    """Bring a decoded array to (H, W) / (H, W, 3|4) and uint8/uint16/float32, losslessly."""
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    elif img.ndim == 3 and img.shape[2] == 2:  # gray + alpha -> BGRA
        img = img[:, :, [0, 0, 0, 1]]
    if img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[2] not in (3, 4)):
        raise InputError(f"cannot read {p}: unsupported image layout {img.shape}")
    dt = img.dtype
    if dt in DTYPES:
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


def _read_npy(p: Path) -> np.ndarray:
    """A .npy image: the file `p` memory-mapped read-only (where it can be used as
    stored; converted in memory otherwise)."""
    try:
        arr = np.load(p, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"cannot read {p}: not a valid .npy file ({detail})") from e
    if arr.size == 0:
        raise InputError(f"cannot read {p}: the array is empty (shape {arr.shape})")
    return np.ascontiguousarray(normalize(arr, p))


def read_frames(p: Path) -> tuple[np.ndarray, int, str | None]:
    """`read_image`'s work without its MultiFrameWarning: (the image, the file's frames
    or pages, its kind: "png", "jpeg", "tiff", ... or None). Any thread may call it."""
    with open_input(p) as f:
        fd = f.fileno()
        head = os.read(fd, len(NPY_MAGIC))  # past f's buffer, which stays empty,
        os.lseek(fd, 0, os.SEEK_SET)  # at the offset f takes the file to be at
        if head == NPY_MAGIC:
            return _read_npy(p), 1, None
        if head[:4] in TIFF_MAGIC:
            found = _read_tiff(p, f)
            if found is not None:
                return np.ascontiguousarray(normalize(found, p)), _pages(f), "tiff"
        size = os.fstat(fd).st_size
        if size >= DECODE_FROM_PATH_BYTES:
            return _read_from_path(p, f)
        os.lseek(fd, 0, os.SEEK_SET)  # from the start, wherever tiff.read left it
        data = _read_all(fd, size)
    kind = sniff(data)
    scan = _checked(p, data, kind)
    cv2 = import_cv2()
    img, cv_detail = cv_call(
        cv2, lambda: cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    )
    if img is None:
        _check_pixel_limit(p, cv_detail)
        img = decode(data, p, kind, cv_detail)
    elif kind in _SCANNERS:  # OpenCV's TIFF decoder applies TIFF orientation itself
        img = apply_orientation(img, exif_orientation(scan.exif))
    img = np.ascontiguousarray(normalize(img, p))
    return img, frame_count(data, kind), kind


def _read_all(fd: int, size: int) -> bytes:
    """The file open as `fd`, from its offset to its end (`size` bytes by its fstat):
    one read system call into one new bytes object, the GIL let go while the kernel
    copies. (Reading through a buffered file joined its buffer's first bytes to the
    rest: a second copy of the whole file, holding the GIL.) A read that stops short,
    or a file that grew meanwhile, is read on to the end."""
    data = os.read(fd, size + 1)
    if len(data) == size:
        return data
    chunks = [data]
    while chunk := os.read(fd, max(size, 1 << 20)):
        chunks.append(chunk)
    return b"".join(chunks)


def _pages(f: BinaryIO) -> int:
    from . import tiff

    f.seek(0)
    return tiff.page_count(f)


def _read_tiff(p: Path, f: BinaryIO) -> np.ndarray | None:
    """The TIFF open as `f` decoded by `tiff.read` from the file (each strip or tile read
    where it lies; on a pool of threads from TIFF_THREADS_MIN_BYTES, on this thread
    below); None for a layout that reader does not take (OpenCV decodes those).
    InputError for damaged strips, which OpenCV would decode to wrong rows."""
    from . import tiff  # for TIFFs only: tifffile's import costs any other read

    size = os.fstat(f.fileno()).st_size
    try:
        return tiff.read(f, threads=None if size >= TIFF_THREADS_MIN_BYTES else 1)
    except tiff.DamagedTiff as e:
        raise InputError(f"cannot read {p}: damaged TIFF ({e})") from None
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror or e}") from None


def _read_from_path(p: Path, f: BinaryIO) -> tuple[np.ndarray, int, str | None]:
    """`read_frames` of a file of DECODE_FROM_PATH_BYTES or more, open as `f`: its bytes
    (not a TIFF's) read to check them and find the EXIF orientation and frames as usual,
    then dropped, and the image decoded from the path (`cv2.imread`)."""
    f.seek(0)
    is_tiff = f.read(4) in TIFF_MAGIC
    kind, scan, frames = "tiff", _Scan(), 0
    if not is_tiff:
        f.seek(0)
        data = f.read()
        kind = sniff(data)
        scan = _checked(p, data, kind)
        frames = frame_count(data, kind)
        del data
    cv2 = import_cv2()
    img, detail = cv_call(cv2, lambda: cv2.imread(str(p), cv2.IMREAD_UNCHANGED))
    if img is None:
        detail = detail or "no details"
        _check_pixel_limit(p, detail)
        what = f"{KIND_NAMES[kind]} file" if kind in KIND_NAMES else "file"
        raise InputError(f"cannot read {p}: OpenCV could not decode this {what} ({detail})")
    if kind in _SCANNERS:  # OpenCV's TIFF decoder applies TIFF orientation itself
        img = apply_orientation(img, exif_orientation(scan.exif))
    img = np.ascontiguousarray(normalize(img, p))
    return img, _pages(f) if is_tiff else frames, kind


def _check_pixel_limit(p: Path, detail: str) -> None:
    """InputError naming OpenCV's pixel limit when that is why it could not decode."""
    if "CV_IO_MAX_IMAGE_PIXELS" not in detail:
        return
    if cv2_loaded_first():
        why = ("cv2 was loaded before imgfilter first read an image, so it keeps its "
               "limit of 2^30: set OPENCV_IO_MAX_IMAGE_PIXELS before importing cv2")  # fmt: skip
    else:
        limit = os.environ.get("OPENCV_IO_MAX_IMAGE_PIXELS")
        why = f"OPENCV_IO_MAX_IMAGE_PIXELS={limit}: set it higher before cv2 is imported"
    raise InputError(f"cannot read {p}: it has more pixels than OpenCV decodes ({why})")


def note_frames(p: Path, frames: int, kind: str | None) -> None:
    """The MultiFrameWarning of a file read as its first of `frames` frames or pages."""
    if frames > 1:
        what = "pages" if kind == "tiff" else "frames"
        warnings.warn(f"{p} has {frames} {what}; reading the first", MultiFrameWarning,
                      stacklevel=3)  # fmt: skip
