"""`imgfilter compare`: one filter through imgfilter and OpenCV, the differences
(imgfilter.compare), the timings and the verdict (exit 1 on disagreement)."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import UsageError
from .options import (
    BackendOpt,
    BorderOpt,
    BorderValueOpt,
    DebugOpt,
    InPath,
    MethodOpt,
    NormalizeOpt,
    QuietOpt,
    box_side_option,
)
from .output import describe, fail
from .typer_app import app_command, command
from .values import (
    Backend,
    Border,
    Method,
    border_value,
    check_gpu_first,
    engine,
    parse_kernel,
    resolve_backend,
)

CompareBoxOpt = Annotated[
    int | None, box_side_option("Compare the box blur of side K with cv2.blur.")
]
CompareKernelOpt = Annotated[
    str | None,
    typer.Option(
        "--kernel",
        metavar="SPEC",
        help="Compare filter with this kernel (file or '1,0,-1;...') with cv2.filter2D.",
    ),
]
ContourOpt = Annotated[
    bool,
    typer.Option("--contour", metavar="", help="Compare contour with four cv2.filter2D calls."),
]
AsJsonOpt = Annotated[
    bool, typer.Option("--json", metavar="", help="Print one JSON object instead of the table.")
]


@app_command("compare")
@command
def compare(
    image: InPath,
    k: CompareBoxOpt = None,
    kernel: CompareKernelOpt = None,
    normalize: NormalizeOpt = False,
    contour_: ContourOpt = False,
    border: BorderOpt = Border.reflect101,
    border_value_: BorderValueOpt = None,
    backend: BackendOpt = Backend.auto,
    method: MethodOpt = Method.auto,
    as_json: AsJsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Check imgfilter against OpenCV: differences, timings, verdict.

    Runs imgfilter and the OpenCV reference on IN and prints the max and mean
    absolute difference, the PSNR (inf when identical) and the wall time of each
    in ms (each is called once untimed first, so JIT compiling is not counted).

    Exit 0 when they agree within tolerance (exact for an integer kernel on an
    integer image, else 1 LSB for integer images and 1e-5 * max(1, sum|kernel|
    * max|img|) for float32 images), exit 1 when they disagree.

    Examples:

      imgfilter compare photo.jpg --k 21

      imgfilter compare photo.jpg --kernel "0,-1,0;-1,5,-1;0,-1,0" --json
    """
    _check_choice(k, kernel, contour_, normalize)
    value = border_value(border, border_value_)
    kern = _kernel_of(k, kernel, normalize)

    from .. import compare as agreement
    from .. import io

    check_gpu_first(backend)  # exit 5 before reading the image
    img = io.read_image(image)
    if contour_ and img.dtype.kind == "f":
        raise UsageError(f"contour needs an integer image (uint8 or uint16); {image} is float")
    backend_name = resolve_backend(backend)
    opts = dict(border=border.value, border_value=value, backend=backend_name, method=method.value)
    op, ref_name, ours, theirs = _calls(img, k, kernel, normalize, kern, opts)
    ours()  # warm-up: JIT compilation and first-call set-up are not timed
    out, ours_ms = _timed(ours)
    theirs()
    ref, ref_ms = _timed(theirs)

    a = agreement.agreement(out, ref, img, kern)
    ran = engine(backend_name, method)
    times = (ours_ms, ref_ms, ref_name)
    if as_json:
        import json

        print(json.dumps(_record(image, op, img, opts, a, times)))
    else:
        print("\n".join(_table(image, op, img, border.value, ran, a, times)))
    if not a.agree:
        fail(
            f"imgfilter and OpenCV disagree: max abs diff {a.max_abs_diff:g} exceeds the "
            f"tolerance {a.tolerance:g} ({op}, border {border.value}, {ran})"
        )
        raise typer.Exit(1)


def _check_choice(k: int | None, kernel: str | None, contour: bool, normalize: bool) -> None:
    """UsageError unless exactly one of --k, --kernel and --contour is given, and
    --normalize only with --kernel."""
    chosen = [name for name, on in (("--k", k is not None), ("--kernel", kernel is not None),
                                    ("--contour", contour)) if on]  # fmt: skip
    if len(chosen) != 1:
        given = " and ".join(chosen) if chosen else "none"
        raise UsageError(f"give exactly one of --k, --kernel or --contour (got {given})")
    if normalize and kernel is None:
        raise UsageError("--normalize applies to --kernel")


def _kernel_of(k: int | None, kernel: str | None, normalize: bool) -> Any:
    """The float32 kernel the tolerance is judged by: --kernel's, the box of side K, or
    (contour: integer kernels) [[1]]."""
    import numpy as np

    if kernel is not None:
        return parse_kernel(kernel, normalize).astype(np.float32)
    if k is not None:
        return np.full((k, k), 1.0 / (k * k), dtype=np.float32)
    return np.array([[1.0]], dtype=np.float32)


def _calls(
    img: Any, k: int | None, kernel: str | None, normalize: bool, kern: Any, opts: dict
) -> tuple[str, str, Callable[[], Any], Callable[[], Any]]:
    """(what is compared, the OpenCV call's name, imgfilter's call, OpenCV's call)."""
    from .. import api
    from ..backends import opencv

    bname, value = opts["border"], opts["border_value"]
    if k is not None:
        ours = functools.partial(api.blur, img, k, **opts)
        theirs = functools.partial(opencv.blur, img, k, bname, value)
        return f"blur --k {k}", "cv2.blur", ours, theirs
    if kernel is not None:
        op = f"filter --kernel {kernel}" + (" --normalize" if normalize else "")
        ours = functools.partial(api.filter2d, img, kern, **opts)
        theirs = functools.partial(opencv.filter2d, img, kern, None, bname, value)
        return op, "cv2.filter2D", ours, theirs
    ours = functools.partial(api.contour, img, **opts)
    theirs = functools.partial(opencv.contour, img, bname, value)
    return "contour", "4 x cv2.filter2D + cv2.bitwise_or", ours, theirs


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """fn()'s result and its wall time in ms."""
    start = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - start) * 1e3


def _record(
    image: Path, op: str, img: Any, opts: dict, a: Any, times: tuple[float, float, str]
) -> dict[str, Any]:
    """The --json object."""
    ours_ms, ref_ms, ref_name = times
    return {
        "image": str(image),
        "op": op,
        "shape": list(img.shape),
        "dtype": str(img.dtype),
        "border": opts["border"],
        "backend": opts["backend"],
        "method": opts["method"],
        "max_abs_diff": a.max_abs_diff,
        "mean_abs_diff": a.mean_abs_diff,
        "psnr_db": None if math.isinf(a.psnr_db) else a.psnr_db,
        "identical": a.identical,
        "imgfilter_ms": ours_ms,
        "opencv_ms": ref_ms,
        "opencv_call": ref_name,
        "timing": "wall ms of one call, each after one untimed warm-up call",
        "tolerance": a.tolerance,
        "tolerance_rule": a.tolerance_rule,
        "agree": a.agree,
        "verdict": "agree" if a.agree else "disagree",
    }


def _table(
    image: Path, op: str, img: Any, border: str, ran: str, a: Any, times: tuple
) -> list[str]:
    """The human table's lines."""
    ours_ms, ref_ms, ref_name = times
    fmt_diff = (lambda x: f"{x:g}") if img.dtype.kind == "u" else (lambda x: f"{x:.3g}")
    psnr_text = "inf (identical)" if math.isinf(a.psnr_db) else f"{a.psnr_db:.2f} dB"
    return [
        f"{op} on {image} ({describe(img)}), border {border}",
        f"  max abs diff   {fmt_diff(a.max_abs_diff)}",
        f"  mean abs diff  {a.mean_abs_diff:.4g}",
        f"  PSNR           {psnr_text}",
        f"  imgfilter      {ours_ms:9.2f} ms  ({ran}, after one warm-up call: no JIT)",
        f"  OpenCV         {ref_ms:9.2f} ms  ({ref_name}, after one warm-up call)",
        f"  tolerance      {a.tolerance:g} ({a.tolerance_rule})",
        f"  verdict        {'agree' if a.agree else 'DISAGREE'}",
    ]
