"""The options the commands share, as Annotated Typer aliases.

A command declares `backend: BackendOpt = Backend.auto` and so on; the help text of
each option lives here once. What the values are and resolve to (`Border`, `Backend`,
`Method`, `border_value`, `parse_kernel`, ...) is in `values`, which needs no Typer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ..names import BLUR_METHODS, FILTER_METHODS, MAX_BOX_SIDE, MAX_KERNEL_SIDE
from .values import Backend, Border, Method

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
        help="Threads that decode and encode images (several inputs). Default: the CPU count.",
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
            "cuda (Numba CUDA), cpu (OpenCV and NumPy, parallel), or auto: cuda when a "
            "usable GPU exists, except a contour of one image up to 128 MiB or a blur of "
            "one up to 40 MiB per CPU (at least 128), which the CPU ends before a GPU "
            "could start."
        ),
    ),
]
MethodOpt = Annotated[
    Method,
    typer.Option(
        "--method",
        case_sensitive=False,
        metavar="NAME",
        help=(
            "The CUDA kernel (auto: the fastest for the case). blur: "
            + ", ".join(BLUR_METHODS)
            + "; filter: "
            + ", ".join(FILTER_METHODS)
            + "."
        ),
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

# The named filters' own options (gaussian, edges, sharpen).
GaussianSideOpt = Annotated[
    int,
    typer.Option(
        "--k",
        "-k",
        min=0,
        max=MAX_KERNEL_SIDE,
        metavar="K",
        help="Kernel side in pixels, odd (1 to 255); 0: from --sigma, as "
        "OpenCV makes it (3 sigma each side for 8-bit images, 4 otherwise).",
    ),
]
SigmaOpt = Annotated[
    float,
    typer.Option(
        "--sigma",
        metavar="S",
        help="Standard deviation in pixels (across, and down unless --sigma-y); 0: "
        "from --k, as OpenCV makes it.",
    ),
]
SigmaYOpt = Annotated[
    float,
    typer.Option("--sigma-y", metavar="S", help="Standard deviation down; 0: --sigma."),
]
SharpenSigmaOpt = Annotated[
    float,
    typer.Option("--sigma", metavar="S", help="The blur's standard deviation in pixels (> 0)."),
]
AmountOpt = Annotated[
    float,
    typer.Option("--amount", metavar="A", help="How much of the image minus its blur is added."),
]
ThresholdOpt = Annotated[
    float,
    typer.Option(
        "--threshold",
        min=0,
        metavar="T",
        help="Leave values whose difference from the blur is below T (in the image's "
        "values, 0 to 255 for 8-bit) as they are; 0: sharpen everywhere.",
    ),
]
ApertureOpt = Annotated[
    int,
    typer.Option(
        "--k",
        "-k",
        min=1,
        max=31,
        metavar="K",
        help="Sobel kernel side: 1, 3, 5, ... 31.",
    ),
]
