"""Reading and writing image files: OpenCV first, tifffile and Pillow where it falls short.

    img = read_image("photo.jpg")        # (H, W, 3) uint8 BGR, EXIF orientation applied
    out = check_output("photo.blur.jpg", input_path="photo.jpg", dtype=img.dtype, channels=3)
    write_image(out, result)             # atomic; refuses formats that would lose data

Arrays are what OpenCV uses: (H, W) gray, (H, W, 3) BGR or (H, W, 4) BGRA, of dtype uint8,
uint16 or float32, C-contiguous.

Reading (`io_read`). Regular files only (a FIFO or a device is refused, never waited
on). Decoded by OpenCV with EXIF orientation applied as ``cv2.imread`` applies it;
TIFFs in strips or tiles (uncompressed, LZW, Deflate) by tifffile, refusing damaged
strips (`imgfilter.tiff`); what OpenCV cannot decode by Pillow (`io_pillow`). A JPEG cut
short, a PNG with a bad checksum or whose header claims more pixels than its data can
hold, a truncated WebP are errors before any decoding. Decoder chatter on stderr is
captured while decoding (`io_native`), so a user sees only our one-line error.

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
outputs get neither), through Pillow (`io_metadata`); the EXIF orientation is set to 1,
since `read_image` has already turned the pixels upright.

Reading a file with several frames (an animated GIF, PNG or WebP, a multi-page TIFF)
gives its first frame and a `MultiFrameWarning` that says how many there are.

Writes are atomic: the encoded bytes go to a temporary file in the target's directory,
are fsync'ed, and are then renamed onto the target, so a failure leaves an existing file
untouched and no partial file behind. `stage_image` splits a write there: it encodes and
writes the temporary file, and returns the fsync and the rename, for another thread to
do while the encoding thread goes on. A process that must stop at once (the CLI on
Ctrl-C) calls `abandon_io()` first: it removes the temporary files of writes still in
progress and gives file descriptor 2 back to stderr if a decoder had borrowed it.

These modules import cv2, tifffile and PIL only inside functions (and never numba), so
importing them is cheap.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .errors import OutputError
from .io_formats import (
    BMP,
    JPEG,
    NPY,
    PNG,
    SUPPORTED_WRITE_EXTENSIONS,
    TIFF,
    WEBP,
    Format,
    check_format,
    check_holds,
    check_output,
    check_path,
    check_quality,
    default_output,
    exists_error,
    format_for,
    is_npy_path,
    real_target,
)
from .io_metadata import (
    METADATA_FORMATS,
    ImageMetadata,
    pillow_encode,
    png_with_metadata,
    read_metadata,
)
from .io_native import abandon_io, create_temp, cv_call, forget_temp, import_cv2
from .io_read import (
    DECODE_FROM_PATH_BYTES,
    TIFF_THREADS_MIN_BYTES,
    MultiFrameWarning,
    note_frames,
    read_frames,
)

__all__ = [
    "DECODE_FROM_PATH_BYTES",
    "METADATA_FORMATS",
    "SUPPORTED_WRITE_EXTENSIONS",
    "TIFF_THREADS_MIN_BYTES",
    "DirectorySync",
    "ImageMetadata",
    "MultiFrameWarning",
    "abandon_io",
    "atomic_write",
    "check_format",
    "check_output",
    "check_path",
    "default_output",
    "format_for",
    "is_npy_path",
    "read_frames",
    "read_image",
    "read_metadata",
    "set_pre_reader",
    "stage_image",
    "write_image",
    "write_npy_from",
]

# A file's contents for `atomic_write`: its bytes (bytes, or any buffer such as the 1-D
# uint8 array cv2.imencode gives), or a function that writes them into the open file (a
# .npy array, streamed rather than encoded in memory).
Contents = bytes | np.ndarray | Callable[[BinaryIO], Any]


# ---------------------------------------------------------------------------------------
# Reading

# What `read_frames` would give for a path, already read elsewhere (`imgfilter.prefetch`
# registers its background read here); None to read the file.
_pre_reader: Callable[[Path], tuple[np.ndarray, int, str | None] | None] | None = None


def set_pre_reader(
    take: Callable[[Path], tuple[np.ndarray, int, str | None] | None] | None,
) -> None:
    """Have `read_image` ask `take(path)` first for an image already read (what
    `read_frames` gives, or None to read the file); None stops asking."""
    global _pre_reader
    _pre_reader = take


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
    taken = _pre_reader(p) if _pre_reader is not None else None
    img, frames, kind = taken or read_frames(p)
    note_frames(p, frames, kind)
    return img


# ---------------------------------------------------------------------------------------
# Writing


def _encode(p: Path, fmt: Format, img: np.ndarray, quality: int | None = None,
            meta: ImageMetadata | None = None) -> Contents:  # fmt: skip
    """The encoded file contents, or OutputError. `quality` (checked): JPEG quality, or
    lossy WebP at that quality; `meta`: EXIF and ICC profile for JPEG, PNG and WebP (JPEG
    and WebP then encoded by Pillow, `io_metadata`). A .npy file, and a TIFF of
    `tiff.BIGTIFF_MIN_BYTES` or more (a BigTIFF), are not encoded in memory: their
    contents are a function that writes them into the open file (`atomic_write`)."""
    if fmt is NPY:
        return functools.partial(np.lib.format.write_array, array=img, allow_pickle=False)
    if fmt is TIFF:
        from . import tiff

        if img.nbytes >= tiff.BIGTIFF_MIN_BYTES:  # past what classic TIFF may hold
            return functools.partial(tiff.write, img=img)
    if meta and fmt in (JPEG, WEBP):
        return pillow_encode(p, fmt.name, img, quality, meta)
    cv2 = import_cv2()
    params: list[int] = []
    channels = 1 if img.ndim == 2 else img.shape[2]
    if fmt is JPEG:
        params = [cv2.IMWRITE_JPEG_QUALITY, 95 if quality is None else quality]
    elif fmt is WEBP and quality is not None:
        params = [cv2.IMWRITE_WEBP_QUALITY, max(1, quality)]  # libwebp's lowest is 1
    elif fmt is TIFF:
        # Explicit, or OpenCV < 5 stores float32 BGR as lossy LogLuv (SGILOG).
        params = [cv2.IMWRITE_TIFF_COMPRESSION, 5]  # LZW
    elif fmt is BMP and channels == 4:
        params = [cv2.IMWRITE_BMP_COMPRESSION, cv2.IMWRITE_BMP_COMPRESSION_BITFIELDS]
    elif fmt is WEBP:
        if hasattr(cv2, "IMWRITE_WEBP_LOSSLESS_PRESERVE_COLOR"):
            # Lossless that keeps the colour under fully transparent pixels too.
            params = [cv2.IMWRITE_WEBP_LOSSLESS_MODE, cv2.IMWRITE_WEBP_LOSSLESS_PRESERVE_COLOR]
        elif channels == 4:  # Pillow's lossless WebP keeps it with exact=True
            return pillow_encode(p, fmt.name, img, None, None)
        else:
            params = [cv2.IMWRITE_WEBP_QUALITY, 101]  # lossless
    encoded, detail = cv_call(cv2, lambda: cv2.imencode(p.suffix.lower(), img, params))
    ok, buf = encoded or (False, None)
    if not ok or buf is None:
        detail = detail or "no details"
        raise OutputError(f"cannot write {p}: OpenCV could not encode it as {fmt.name} ({detail})")
    if meta and fmt is PNG:
        return png_with_metadata(buf.tobytes(), meta)
    return buf  # written as it is: a copy into bytes would hold the GIL


def _publish(tmp: Path, target: Path, *, overwrite: bool, shown: Path) -> None:
    """Move the finished temp file onto `target`; without overwrite, never clobber."""
    if overwrite:
        os.replace(tmp, target)
        return
    try:
        os.link(tmp, target)  # atomic and fails if target appeared since the check
    except FileExistsError as e:
        raise exists_error(shown) from e
    except OSError:  # no hard links on this file system
        if os.path.lexists(target):
            raise exists_error(shown) from None
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
    _stage(p, data, overwrite=overwrite, directories=directories)()


def _stage(p: Path, data: Contents, *, overwrite: bool,
           directories: DirectorySync | None) -> Callable[[], Path]:  # fmt: skip
    """`atomic_write`'s first half: `data` written into a new temp file beside `p`'s
    target, left open. Returns the second half, to be called once: fsync the file,
    rename it onto the target (keeping an existing file's mode), sync or note the
    directory, return `p`. A half that fails removes the temp file and raises
    OutputError (for an OSError) or what `data` raised."""
    target = real_target(p)
    mode = None
    with contextlib.suppress(OSError):
        mode = stat.S_IMODE(os.stat(target).st_mode)  # keep an existing file's mode
    try:
        fd, tmp = create_temp(target.parent, target.name)
    except OSError as e:
        raise OutputError(f"cannot write {p}: {e.strerror or e}") from e
    is_open = True

    @contextlib.contextmanager
    def undone_on_failure() -> Iterator[None]:
        try:
            yield
        except BaseException as e:
            if is_open:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            forget_temp(tmp)
            if isinstance(e, OSError):
                raise OutputError(f"cannot write {p}: {e.strerror or e}") from e
            raise

    with undone_on_failure():
        if callable(data):
            with os.fdopen(os.dup(fd), "wb") as f:  # fd itself stays open for the fsync
                data(f)
        else:
            _write_all(fd, data)

    def commit() -> Path:
        nonlocal is_open
        with undone_on_failure():
            os.fsync(fd)
            is_open = False
            os.close(fd)
            if mode is not None:
                os.chmod(tmp, mode)
            _publish(tmp, target, overwrite=overwrite, shown=p)
        forget_temp(tmp)
        if directories is None:
            _fsync_directory(target.parent)
        else:
            directories.add(target.parent)
        return p

    return commit


def _write_all(fd: int, data: bytes | np.ndarray) -> None:
    """All of the buffer `data` into the open file `fd`, straight from where it lies
    (the GIL let go during each write)."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        if written == 0:  # never for a regular file; a full disk raises ENOSPC
            raise OSError(errno.EIO, "the file takes no more bytes")
        view = view[written:]


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
    return stage_image(path, img, overwrite=overwrite, quality=quality, metadata=metadata,
                       directories=directories)()  # fmt: skip


def stage_image(
    path: str | os.PathLike[str],
    img: np.ndarray,
    *,
    overwrite: bool = False,
    quality: int | None = None,
    metadata: ImageMetadata | None = None,
    directories: DirectorySync | None = None,
) -> Callable[[], Path]:
    """`write_image` in two halves, for a thread that encodes images one after another
    and should not wait for the disk (the many-files pipeline's codec threads).

    Now: `write_image`'s checks (the same errors), the encoding, and the bytes written
    into a temporary file beside the target (left open; `abandon_io` removes it).
    Returned: a function, to be called once (from any thread), that fsyncs that file,
    renames it onto `path` (refusing an existing file unless `overwrite`, as
    `write_image` does) and returns `path`; until then nothing is at `path`. Either half
    that fails removes the temporary file and raises OutputError. ``write_image(...)``
    is ``stage_image(...)()``.
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
    q = check_quality(p, fmt, quality)
    check_holds(p, fmt, arr.dtype, channels)
    check_path(p, input_path=None, overwrite=overwrite)
    data = _encode(p, fmt, np.ascontiguousarray(arr), q, metadata)
    return _stage(p, data, overwrite=overwrite, directories=directories)


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
    if format_for(p) is not NPY:
        raise OutputError(f"cannot write {p}: write_npy_from writes .npy files only")
    dt = np.dtype(dtype)
    if len(shape) not in (2, 3) or 0 in shape:
        raise OutputError(
            f"cannot write {p}: an image must be (H, W) or (H, W, C) and non-empty, "
            f"got shape {tuple(shape)}"
        )
    check_holds(p, NPY, dt, 1 if len(shape) == 2 else int(shape[2]))
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
