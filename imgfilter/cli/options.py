"""The options the commands share, as Annotated aliases, and what they resolve to.

A command declares `backend: BackendOpt = Backend.auto` and so on; the help text of
each option lives here once. `border_value`, `resolve_backend`, `engine` and
`parse_kernel` turn the parsed values into what imgfilter.api takes.
"""

from __future__ import annotations

import contextlib
import io as _text_io
import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from ..api import MAX_BOX_SIDE, METHODS  # imgfilter/__init__ has imported api already
from ..backends import BACKENDS
from ..border import BORDERS
from ..errors import UsageError
from .output import Run, note

Border = Enum("Border", {name: name for name in BORDERS}, type=str)
Backend = Enum("Backend", {name: name for name in BACKENDS}, type=str)
Method = Enum("Method", {name: name for name in METHODS}, type=str)

InPath = Annotated[
    Path, typer.Argument(metavar="INPUT", help="Input image (PNG, JPEG, TIFF, BMP, ...).")
]
InPaths = Annotated[
    list[Path],
    typer.Argument(
        metavar="INPUT",
        show_default=False,
        help="Input images (PNG, JPEG, TIFF, BMP, ...): one or more files, directories "
        "(the images inside; --recursive for subdirectories) or patterns such as "
        "'photos/*.jpg' ('**' for any depth).",
    ),
]
OutPath = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        metavar="OUT",
        help="Output image; its extension picks the format. "
        "Default: INPUT_STEM.OP.EXT beside INPUT. One input only.",
    ),
]
OutDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--out-dir",
        metavar="DIR",
        help="Write the outputs here (created if missing), under the same subdirectories "
        "as below each input directory. Default: beside each input.",
    ),
]
NameOpt = Annotated[
    str | None,
    typer.Option(
        "--name",
        metavar="TEMPLATE",
        help="Output file names, a template of the fields stem, ext (the input's "
        "extension, or .png where it cannot be written), name and op, each in braces "
        "as in Python's str.format (docs/many-files.md). Default: INPUT_STEM.OP.EXT.",
    ),
]
RecursiveOpt = Annotated[
    bool,
    typer.Option(
        "--recursive", "-r", metavar="", help="Take images from subdirectories of directories too."
    ),
]
JobsOpt = Annotated[
    int | None,
    typer.Option(
        "--jobs",
        "-j",
        min=1,
        max=256,
        metavar="N",
        help="Threads that decode and encode images (several inputs). "
        "Default: the CPU count, at most 8.",
    ),
]
SkipExistingOpt = Annotated[
    bool,
    typer.Option(
        "--skip-existing",
        metavar="",
        help="Leave outputs that exist as they are and skip their inputs (resume).",
    ),
]
BorderOpt = Annotated[
    Border,
    typer.Option(
        "--border",
        case_sensitive=False,
        metavar="MODE",
        help=(
            "How pixels outside the image are made up: reflect101 (OpenCV's default), "
            "reflect, replicate, constant, wrap."
        ),
    ),
]
BorderValueOpt = Annotated[
    float | None,
    typer.Option(
        "--border-value", metavar="FLOAT", help="Value outside the image for --border constant."
    ),
]
BackendOpt = Annotated[
    Backend,
    typer.Option(
        "--backend",
        case_sensitive=False,
        help=(
            "cuda (Numba CUDA), cpu (OpenCV and Numba, parallel), or auto: cuda when a "
            "usable GPU exists, except a blur of one image up to 128 MiB, which the CPU "
            "ends before a GPU could start."
        ),
    ),
]
MethodOpt = Annotated[
    Method,
    typer.Option(
        "--method",
        case_sensitive=False,
        metavar="NAME",
        help="CUDA kernel variant: " + ", ".join(METHODS) + " (auto: the fastest for the case).",
    ),
]
ForceOpt = Annotated[
    bool,
    typer.Option("--force", "-f", metavar="", help="Overwrite an existing output file."),
]
DebugOpt = Annotated[bool, typer.Option("--debug", metavar="", help="Show tracebacks for errors.")]
QuietOpt = Annotated[
    bool,
    typer.Option("--quiet", "-q", metavar="", help="Only errors on stderr: no notes, no progress."),
]
QualityOpt = Annotated[
    int | None,
    typer.Option(
        "--quality",
        min=0,
        max=100,
        metavar="Q",
        help="JPEG quality 0-100 (default 95), or lossy WebP at quality Q (default: "
        "lossless WebP). Only for .jpg/.jpeg/.webp outputs.",
    ),
]
GpusOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus",
        min=1,
        metavar="N",
        help="Filter the files on a local Dask cluster of N GPU workers (dask-cuda).",
    ),
]
SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        metavar="ADDRESS",
        help="Filter the files on the Dask cluster at ADDRESS (its workers read and "
        "write the same paths).",
    ),
]
MaxGpuMemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--max-gpu-memory",
        metavar="SIZE",
        help="GPU memory a filter may take, e.g. 2G or 512M: larger images are "
        "streamed through it in row bands (the same result). Default: what is free.",
    ),
]
KeepMetadataOpt = Annotated[
    bool,
    typer.Option(
        "--keep-metadata",
        metavar="",
        help="Copy the input's EXIF and ICC colour profile into a JPEG, PNG or WebP "
        "output (orientation set to 1: the pixels are already upright).",
    ),
]


def box_side_option(help: str) -> Any:
    """The --k/-k option, 1 to MAX_BOX_SIDE, with this help."""
    return typer.Option("--k", "-k", min=1, max=MAX_BOX_SIDE, metavar="K", help=help)


BoxSideOpt = Annotated[
    int, box_side_option("Side of the square box in pixels (1 to 4095; even sizes as in OpenCV).")
]
KernelOpt = Annotated[
    str,
    typer.Option(
        "--kernel",
        metavar="SPEC",
        help=(
            "Kernel: a .npy/.txt/.csv file, or a matrix such as '1,2,1;2,4,2;1,2,1' "
            "(rows by ';', entries by ',' or spaces, fractions like 1/9 allowed)."
        ),
    ),
]
NormalizeOpt = Annotated[
    bool,
    typer.Option(
        "--normalize", metavar="", help="Divide the kernel by its sum (which must not be 0)."
    ),
]


def border_value(border: Border, value: float | None) -> float:
    """--border-value as a float (0 when not given); UsageError unless --border
    constant or when not finite."""
    if value is None:
        return 0.0
    if border.value != "constant":
        raise UsageError(f"--border-value applies to --border constant, not {border.value}")
    if not math.isfinite(value):
        raise UsageError(f"--border-value must be finite, got {value}")
    return float(value)


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def gpu_bytes(size: str | None) -> int | None:
    """--max-gpu-memory SIZE in bytes: a positive number with an optional K, M, G or T
    (binary units; a trailing B or iB is allowed); UsageError otherwise."""
    if size is None:
        return None
    text = size.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    number = text[: len(text) - len(unit)]
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 1:
        raise UsageError(f"--max-gpu-memory must be a size such as 2G or 512M, got {size!r}")
    return int(value)


def resolve_backend(backend: Backend) -> str:
    """The backend that will run ("cuda"/"cpu"); DeviceError if cuda cannot.

    For auto without a usable GPU, get_backend notes the CPU fallback on stderr once
    (not with --quiet).
    """
    from ..backends import get_backend

    if Run.quiet:  # the fallback note is informational
        with contextlib.redirect_stderr(_text_io.StringIO()):
            return get_backend(backend.value).NAME
    return get_backend(backend.value).NAME


def check_gpu_first(backend: Backend) -> None:
    """--backend cuda without a usable GPU: DeviceError (exit 5) before any I/O."""
    if backend is Backend.cuda:
        resolve_backend(backend)


def note_unused_method(backend_name: str, method: Method) -> None:
    """--method picks among CUDA kernels; say so when the CPU backend runs instead."""
    if backend_name == "cpu" and method.value != "auto":
        note(
            f"--method {method.value} applies to the CUDA backend; "
            "the CPU backend has one implementation"
        )


def engine(backend_name: str, method: Enum) -> str:
    """What ran, as the `wrote` lines say it: `cuda/METHOD` or `cpu`."""
    return f"{backend_name}/{method.value}" if backend_name == "cuda" else backend_name


def parse_kernel(spec: str, normalize: bool) -> Any:
    """--kernel SPEC (a file or a matrix) as an array, divided by its sum with
    --normalize; UsageError or InputError for a bad one."""
    from ..kernelspec import normalize_kernel
    from ..kernelspec import parse_kernel as parse

    k = parse(spec)
    return normalize_kernel(k) if normalize else k
