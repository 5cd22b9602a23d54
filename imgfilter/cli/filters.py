"""The filtering commands, `blur`, `filter`, `contour` and the named filters (`gaussian`,
`edges`, `sharpen`), declared for Typer from one table.

Each takes INPUT... and the same output, border, backend and many-files options
(`_COMMON`); a `Filter` adds its own options. What a command does with them is
`filtering.run` (imported when a command runs: `--help` needs none of it).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .options import (
    AmountOpt,
    ApertureOpt,
    BackendOpt,
    BorderOpt,
    BorderValueOpt,
    BoxSideOpt,
    DebugOpt,
    ForceOpt,
    GaussianSideOpt,
    GpusOpt,
    InPaths,
    JobsOpt,
    KeepMetadataOpt,
    KernelOpt,
    MaxGpuMemoryOpt,
    MethodOpt,
    NameOpt,
    NormalizeOpt,
    OutDirOpt,
    OutPath,
    QualityOpt,
    QuietOpt,
    RecursiveOpt,
    SchedulerOpt,
    SharpenSigmaOpt,
    SigmaOpt,
    SigmaYOpt,
    SkipExistingOpt,
    ThresholdOpt,
)
from .typer_app import app_command, command
from .values import Backend, Border, Method


@dataclass(frozen=True)
class Filter:
    """One filtering command for Typer: `op` names the command (a key of
    `filtering.OPS`), `own` its options after INPUT (name, Annotated alias, default),
    `doc` its help."""

    op: str
    own: tuple[tuple[str, Any, Any], ...]
    doc: str


_REQUIRED = inspect.Parameter.empty

FILTERS = (
    Filter(
        "blur",
        (("k", BoxSideOpt, _REQUIRED),),
        """Box blur over K x K pixels: cv2.blur(img, (K, K)).

        Each output pixel is the mean of the K x K window around it.

        Examples:

          imgfilter blur photo.jpg --k 21   (writes photo.blur.jpg)

          imgfilter blur photos/ --recursive --k 5 --out-dir blurred   (many files)
        """,
    ),
    Filter(
        "filter",
        (("kernel", KernelOpt, _REQUIRED), ("normalize", NormalizeOpt, False)),
        """Correlate with a kernel: cv2.filter2D(img, -1, kernel).

        The kernel is not flipped and its anchor is the centre, as in OpenCV.

        Examples:

          imgfilter filter photo.jpg --kernel "-1,0,1;-2,0,2;-1,0,1"   (Sobel x)

          imgfilter filter photo.jpg --kernel "1 2 1; 2 4 2; 1 2 1" --normalize

          imgfilter filter photo.jpg --kernel sharpen.npy -o sharp.png

          imgfilter filter photos/ --kernel sharpen.npy --out-dir sharp --skip-existing
        """,
    ),
    Filter(
        "contour",
        (),
        """Edge map: four 3x3 edge kernels, OR-merged (one channel out).

        The kernels run on the gray image (colour is converted as cv2.cvtColor does);
        the result is bit-exact with four cv2.filter2D calls and cv2.bitwise_or.
        Needs a uint8 or uint16 image.

        Examples:

          imgfilter contour photo.jpg   (writes photo.contour.jpg)

          imgfilter contour 'scans/*.png' --out-dir edges -j 4
        """,
    ),
    Filter(
        "gaussian",
        (("k", GaussianSideOpt, 0), ("sigma", SigmaOpt, 0.0), ("sigma_y", SigmaYOpt, 0.0)),
        """Gaussian blur: cv2.GaussianBlur(img, (K, K), S, sigmaY=SY).

        Give --k, --sigma or both; the missing one comes from the other as in OpenCV.
        8- and 16-bit results equal OpenCV's within 1 LSB (exact halves round to even).

        Examples:

          imgfilter gaussian photo.jpg --k 21 --sigma 3.5   (writes photo.gaussian.jpg)

          imgfilter gaussian photos/ -r --sigma 2 --out-dir soft
        """,
    ),
    Filter(
        "edges",
        (("k", ApertureOpt, 3),),
        """Edge strength: the Sobel gradient magnitude, as 8 bits.

        cv2.magnitude of cv2.Sobel x and y (float32), then cv2.convertScaleAbs with
        alpha 1 for 8-bit images, 255/65535 for 16-bit, 255 for float (0 to 1): uint8
        out, each channel alone; strong edges saturate at 255.

        Examples:

          imgfilter edges photo.jpg   (writes photo.edges.jpg)

          imgfilter edges scans/ --k 5 --out-dir edges --name '{stem}.png'
        """,
    ),
    Filter(
        "sharpen",
        (
            ("sigma", SharpenSigmaOpt, _REQUIRED),
            ("amount", AmountOpt, 1.0),
            ("threshold", ThresholdOpt, 0.0),
        ),
        """Unsharp mask: img + A * (img - Gaussian blur of sigma S), saturated.

        The blur is gaussian's with --k 0 (its size from S); with --threshold T,
        values within T of the blur are left as they are.

        Examples:

          imgfilter sharpen photo.jpg --sigma 2 --amount 1.5   (writes photo.sharpen.jpg)

          imgfilter sharpen scans/ --sigma 1 --threshold 4 --out-dir sharp
        """,
    ),
)

# (name, Annotated alias, default) of the options every filtering command takes after
# its own, in the order --help lists them.
_COMMON = (
    ("output", OutPath, None),
    ("border", BorderOpt, Border.reflect101),
    ("border_value", BorderValueOpt, None),
    ("backend", BackendOpt, Backend.auto),
    ("method", MethodOpt, Method.auto),
    ("max_gpu_memory", MaxGpuMemoryOpt, None),
    ("out_dir", OutDirOpt, None),
    ("name", NameOpt, None),
    ("recursive", RecursiveOpt, False),
    ("jobs", JobsOpt, None),
    ("gpus", GpusOpt, None),
    ("scheduler", SchedulerOpt, None),
    ("quality", QualityOpt, None),
    ("keep_metadata", KeepMetadataOpt, False),
    ("force", ForceOpt, False),
    ("skip_existing", SkipExistingOpt, False),
    ("quiet", QuietOpt, False),
    ("debug", DebugOpt, False),
)


def _register(spec: Filter) -> Callable[..., Any]:
    """The Typer command of `spec`: INPUT..., its own options, then `_COMMON`."""

    def run(**options: Any) -> None:
        from . import filtering

        filtering.run(spec.op, options)

    declared = (("images", InPaths, _REQUIRED), *spec.own, *_COMMON)
    params = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                          annotation=alias)
        for name, alias, default in declared
    ]  # fmt: skip
    run.__name__ = run.__qualname__ = spec.op
    run.__doc__ = spec.doc
    run.__signature__ = inspect.Signature(params, return_annotation=None)
    run.__annotations__ = {p.name: p.annotation for p in params}
    return app_command(spec.op)(command(run, spinner=True))


for _spec in FILTERS:
    _register(_spec)
