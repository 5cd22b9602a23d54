"""What each output format can hold, and whether an output path can be written.

`format_for` picks the format from the extension; `check_holds` refuses an image the
format would silently convert (OpenCV turns uint16 into 8 bits for JPEG, float32 into 8
bits for PNG, BGRA into BGR for JPEG, ...), naming an extension that can hold it;
`check_path` refuses a target that cannot be created or replaced. `check_output` and
`check_format` run them before any work is done. The table is in `imgfilter.io`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import OutputError, UsageError
from .io_native import import_cv2

DTYPES = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.float32))


@dataclass(frozen=True)
class Format:
    """An output format: its name, and the dtypes and channel counts it holds."""

    name: str
    dtypes: tuple[str, ...]
    channels: tuple[int, ...]
    depth_text: str  # "8-bit images", for messages


JPEG = Format("JPEG", ("uint8",), (1, 3), "8-bit images")
PNG = Format("PNG", ("uint8", "uint16"), (1, 3, 4), "8- and 16-bit integer images")
TIFF = Format("TIFF", ("uint8", "uint16", "float32"), (1, 3, 4), "")
BMP = Format("BMP", ("uint8",), (1, 3, 4), "8-bit images")
WEBP = Format("WebP", ("uint8",), (1, 3, 4), "8-bit images")
NPY = Format("NumPy", ("uint8", "uint16", "float32"), (1, 3, 4), "")

FORMATS: dict[str, Format] = {
    ".jpg": JPEG,
    ".jpeg": JPEG,
    ".png": PNG,
    ".tif": TIFF,
    ".tiff": TIFF,
    ".bmp": BMP,
    ".webp": WEBP,
    ".npy": NPY,
}
SUPPORTED_WRITE_EXTENSIONS: tuple[str, ...] = tuple(FORMATS)
"""Extensions write_image accepts (compared case-insensitively)."""

# Order in which other extensions are suggested when one cannot hold an image.
_SUGGESTED = (".png", ".tiff", ".webp", ".bmp", ".jpg")


def _channels_supported(fmt: Format) -> tuple[int, ...]:
    """Channel counts `fmt` round-trips with the installed OpenCV.

    OpenCV without IMWRITE_BMP_COMPRESSION (4.8, for one) writes 4-channel BMP as 32-bit
    BI_RGB, whose fourth byte readers (OpenCV's own included) ignore: the alpha channel
    is lost. Versions with it (5.0) write BI_BITFIELDS with an alpha mask.
    """
    if fmt is BMP and not hasattr(import_cv2(), "IMWRITE_BMP_COMPRESSION_BITFIELDS"):
        return (1, 3)
    return fmt.channels


def _holds(ext: str, dtype: np.dtype, channels: int | None) -> bool:
    fmt = FORMATS[ext]
    return dtype.name in fmt.dtypes and (channels is None or channels in _channels_supported(fmt))


def _alternatives(dtype: np.dtype, channels: int | None) -> str:
    exts = [e for e in _SUGGESTED if _holds(e, dtype, channels)]
    return " or ".join([", ".join(exts[:-1]), exts[-1]] if len(exts) > 1 else exts)


def check_holds(p: Path, fmt: Format, dtype: Any, channels: int | None) -> None:
    """OutputError unless `fmt` can store images of `dtype` with `channels` losslessly."""
    dt = None if dtype is None else np.dtype(dtype)
    if dt is not None and dt not in DTYPES:
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
    suffix = p.suffix if p.suffix.lower() in FORMATS else ".png"
    return p.with_name(f"{p.stem}.{op}{suffix}")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return os.path.realpath(a) == os.path.realpath(b)


def real_target(p: Path) -> Path:
    """Where bytes for `p` land: a symlink is followed, so the link itself survives."""
    return Path(os.path.realpath(p)) if p.is_symlink() else p


def check_path(p: Path, *, input_path: Any, overwrite: bool) -> None:
    """OutputError unless `p` can be created or (with overwrite) replaced."""
    target = real_target(p)
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
        raise exists_error(p)


def exists_error(p: Path) -> OutputError:
    """The error for a target that exists where overwriting was not asked for."""
    return OutputError(
        f"{p} exists; pass overwrite=True to replace it",
        cli_message=f"{p} exists; pass --force to overwrite",
    )


def is_npy_path(p: Path) -> bool:
    """Whether `p`'s extension selects a NumPy .npy file (any case)."""
    return p.suffix.lower() == ".npy"


def format_for(p: Path) -> Format:
    """The output format `p`'s extension selects (its `.name`: png, jpeg, tiff...);
    OutputError for "-", a directory or an extension imgfilter cannot write."""
    if str(p) == "-":
        raise OutputError("cannot write to standard output (-): give an output file name")
    if p.is_dir():
        raise OutputError(f"cannot write {p}: it is a directory; give a file name inside it")
    ext = p.suffix.lower()
    if ext not in FORMATS:
        shown = f"extension {p.suffix!r}" if p.suffix else "no extension"
        raise OutputError(
            f"cannot write {p}: {shown} is not a supported image format; "
            f"use one of {', '.join(SUPPORTED_WRITE_EXTENSIONS)}"
        )
    return FORMATS[ext]


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
    check_quality(p, fmt, quality)
    check_holds(p, fmt, dtype, channels)
    return p


def check_quality(p: Path, fmt: Format, quality: Any) -> int | None:
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
    if fmt not in (JPEG, WEBP):
        raise UsageError(
            f"quality applies to JPEG and WebP outputs, not {fmt.name} ({p})",
            cli_message=f"--quality applies to JPEG and WebP outputs, not {fmt.name} ({p})",
        )
    return int(quality)
