"""Kernel specs for the CLI: a file (.npy, .txt, .csv) or an inline matrix.

    parse_kernel("-1,0,1;-2,0,2;-1,0,1")   # rows split by ';', entries by ',' or spaces
    parse_kernel("1/9 1/9 1/9")            # a 1x3 row; entries may be fractions a/b
    parse_kernel("sobel.npy")              # a 2-D array (a 1-D one is a column, as in OpenCV)
    parse_kernel("kernel.txt")             # one row per line, entries by ',' or whitespace,
                                           # '#' starts a comment (what numpy.loadtxt reads)

Every malformed spec raises `UsageError` with one line that says what is wrong.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from .api import MAX_KERNEL_SIDE
from .errors import UsageError

FILE_SUFFIXES = (".npy", ".txt", ".csv")
_SPLIT = re.compile(r"[,\s]+")


def parse_kernel(spec: str) -> np.ndarray:
    """Return the kernel that `spec` names as a 2-D float64 array (rows, cols).

    `spec` is a path to a .npy/.txt/.csv file (or any existing file, read as text), or an
    inline matrix: rows separated by ';', entries by ',' and/or whitespace, each entry a
    number or a fraction such as 1/9. Raises UsageError for an empty or ragged matrix,
    entries that are not numbers, NaN or infinity, arrays that are not 1-D or 2-D, sides
    over 255, and files that are missing or unreadable.
    """
    text = str(spec).strip()
    if not text:
        raise UsageError(
            "kernel spec is empty; give a file or a matrix such as '1,2,1;2,4,2;1,2,1'"
        )
    path = Path(text).expanduser()
    if path.suffix.lower() in FILE_SUFFIXES or _is_file(path):
        kernel = _read_file(path)
    else:
        rows = text.rstrip(";").split(";")
        kernel = _parse_rows(rows, what="row", source=f"kernel {text!r}")
    return _check(kernel, source=str(spec))


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a long inline matrix is not a valid file name
        return False


def normalize_kernel(kernel: np.ndarray) -> np.ndarray:
    """Divide `kernel` by its sum; UsageError when the sum is zero (edge kernels)."""
    k = np.asarray(kernel, dtype=np.float64)
    total = float(k.sum())
    if total == 0.0 or abs(total) <= 1e-12 * float(np.abs(k).sum()):
        raise UsageError("--normalize: the kernel sums to 0, so it cannot be divided by its sum")
    return k / total


def _read_file(path: Path) -> np.ndarray:
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as e:  # e.g. a name too long for the file system
        raise UsageError(f"cannot use kernel file {path}: {e.strerror or e}") from None
    if not exists:
        raise UsageError(f"kernel file not found: {path}")
    if is_dir:
        raise UsageError(f"kernel file is a directory: {path}")
    if path.suffix.lower() == ".npy":
        return _read_npy(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"kernel file {path} is not a text matrix (.txt/.csv)") from None
    except OSError as e:
        raise UsageError(f"cannot read kernel file {path}: {e.strerror or e}") from None
    rows = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            rows.append(line)
    if not rows:
        raise UsageError(f"kernel file {path} holds no numbers")
    return _parse_rows(rows, what="line", source=f"kernel file {path}")


def _read_npy(path: Path) -> np.ndarray:
    try:
        arr = np.load(path, allow_pickle=False)
    except OSError as e:
        raise UsageError(f"cannot read kernel file {path}: {e.strerror or e}") from None
    except ValueError as e:
        # Pickled object arrays, truncated or corrupt headers.
        detail = " ".join(str(e).split()) or "not a valid .npy file"
        raise UsageError(f"kernel file {path} is not a usable .npy array: {detail}") from None
    except Exception as e:  # numpy raises several kinds for garbage input
        raise UsageError(
            f"kernel file {path} is not a valid .npy file ({type(e).__name__})"
        ) from None
    if not isinstance(arr, np.ndarray):
        raise UsageError(f"kernel file {path} holds several arrays; give a single-array .npy")
    if arr.dtype.kind not in "biuf":
        raise UsageError(f"kernel file {path} holds {arr.dtype} values; the kernel must be real")
    if arr.ndim == 0:
        raise UsageError(
            f"kernel file {path} holds a scalar; the kernel must be a 1-D or 2-D array"
        )
    if arr.ndim > 2:
        raise UsageError(
            f"kernel file {path} holds a {arr.ndim}-D array {arr.shape}; "
            "the kernel must be 1-D (a column) or 2-D"
        )
    arr = arr.astype(np.float64)
    return arr.reshape(-1, 1) if arr.ndim == 1 else arr


def _parse_rows(rows: list[str], *, what: str, source: str) -> np.ndarray:
    """Parse text rows into a rectangular float64 matrix (errors name the row or line)."""
    values: list[list[float]] = []
    for i, row in enumerate(rows, start=1):
        entries = [e for e in _SPLIT.split(row.strip()) if e]
        if not entries:
            raise UsageError(f"{source}: {what} {i} is empty")
        values.append([_number(e, source=source, where=f"{what} {i}") for e in entries])
        if len(values[-1]) != len(values[0]):
            raise UsageError(
                f"{source}: {what} {i} has {len(values[-1])} entries but {what} 1 has "
                f"{len(values[0])}; every {what} needs the same number"
            )
    return np.array(values, dtype=np.float64)


def _number(entry: str, *, source: str, where: str) -> float:
    if "_" in entry:  # float() accepts 1_000; a kernel entry with one is surely a typo
        raise UsageError(f"{source}: {where}: {entry!r} is not a number")
    num, _, den = entry.partition("/")
    try:
        value = float(num) if not den else float(num) / float(den)
    except ValueError:
        raise UsageError(f"{source}: {where}: {entry!r} is not a number") from None
    except ZeroDivisionError:
        raise UsageError(f"{source}: {where}: {entry!r} divides by zero") from None
    if not math.isfinite(value):
        raise UsageError(
            f"{source}: {where}: {entry!r} is not finite; NaN and infinity are refused"
        )
    return value


def _check(kernel: np.ndarray, *, source: str) -> np.ndarray:
    if kernel.size == 0:
        raise UsageError(f"kernel {source!r} is empty")
    if not np.isfinite(kernel).all():
        raise UsageError(f"kernel {source!r} contains NaN or infinity")
    if max(kernel.shape) > MAX_KERNEL_SIDE:
        raise UsageError(
            f"kernel {source!r} is {kernel.shape[0]}x{kernel.shape[1]}; "
            f"sides of at most {MAX_KERNEL_SIDE} are supported"
        )
    return np.ascontiguousarray(kernel, dtype=np.float64)
