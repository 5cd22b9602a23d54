"""`imgfilter bench`: runs the benchmark harness of a source checkout on the GPU.

The harness is not part of the installed package: it is `benchmarks/bench.py` (kernel
times beside OpenCV, CuPy and PyTorch) and, with --pipeline, `benchmarks/pipeline.py`
(per-call times beside CV-CUDA), found in the checkout of the current directory or the
one the package is installed from (an editable install). The command checks its
options and the GPU first, so its errors are the same everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer

from ..errors import DeviceError, OutputError, UsageError
from .options import DebugOpt, ForceOpt, QuietOpt
from .output import shown
from .typer_app import app_command, command
from .values import Backend, resolve_backend

SizesOpt = Annotated[
    str,
    typer.Option(
        "--sizes",
        metavar="LIST",
        help="Comma-separated image sizes: seed (2167x2495x3), 4k, 8k.",
    ),
]
JsonPathOpt = Annotated[
    Path | None,
    typer.Option("--json", metavar="FILE", help="Also write the results as JSON here."),
]
QuickOpt = Annotated[
    bool,
    typer.Option(
        "--quick",
        metavar="",
        help="Fewer repeats, kernel sizes (3, 9, 21, 31) and low-rank cases, a smaller "
        "bandwidth probe; every peer.",
    ),
]
PipelineOpt = Annotated[
    bool,
    typer.Option(
        "--pipeline",
        metavar="",
        help="The pipeline view instead: per-call and kernel time of queued calls on "
        "device arrays (720p, 2167x2495, 4K; filters, softmax, GEMV, a batch of 32 "
        "frames) beside CV-CUDA, PyTorch and CuPy (needs CuPy). --sizes is ignored.",
    ),
]


@app_command("bench")
@command
def bench(
    sizes: SizesOpt = "seed",
    json_path: JsonPathOpt = None,
    quick: QuickOpt = False,
    pipeline: PipelineOpt = False,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Time imgfilter's CUDA kernels against OpenCV, CuPy and PyTorch (needs a GPU).

    For each operation and size: GPU kernel time (launches queued behind a spin
    kernel, so Numba's launch cost is not counted), per-call time from Python,
    Mpixel/s, GB/s and the ratio to the floor (bytes at the copy bandwidth or FMAs
    at the FMA rate, both measured in the same run). Peers that are not installed
    are skipped with a note. Runs the harness of a source checkout (benchmarks/).

    Example: imgfilter bench --sizes seed,4k,8k --json results.json
    """
    from .. import io

    chosen = _sizes(sizes, SIZES)
    if json_path is not None:
        _check_json(json_path, force)
    _need_gpu()
    if pipeline:
        _pipeline(quick, json_path)
        return
    harness = harness_module("bench")
    result = harness.run(chosen, quick=quick)
    print(harness.print_table(result))
    if json_path is not None:
        # Atomic, and a temporary file that Ctrl-C removes (io.abandon_io).
        io.atomic_write(json_path, json.dumps(result, indent=1).encode(), overwrite=force)
        if not quiet:
            print(f"wrote {shown(json_path)}")


SIZES = ("seed", "4k", "8k")  # benchmarks/bench.py's SHAPES


def harness_module(name: str, roots: tuple[Path, ...] | None = None) -> ModuleType:
    """benchmarks/NAME.py of a source checkout, imported; UsageError where none is found.

    `roots` are the folders searched for `benchmarks/` (default: the current directory,
    then the folder above the installed package)."""
    if roots is None:
        roots = (Path.cwd(), Path(__file__).resolve().parents[2])
    for root in roots:
        path = root / "benchmarks" / f"{name}.py"
        if path.is_file():
            spec = importlib.util.spec_from_file_location(f"_imgfilter_benchmarks_{name}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses look their module up
            spec.loader.exec_module(module)
            return module
    raise UsageError(
        f"imgfilter bench runs benchmarks/{name}.py of a source checkout, and none was "
        "found: run it from the repository's folder"
    )


def _sizes(sizes: str, known: tuple[str, ...]) -> tuple[str, ...]:
    """--sizes as a tuple of names; UsageError for an unknown one or none."""
    chosen = tuple(s.strip() for s in sizes.split(",") if s.strip())
    unknown = [s for s in chosen if s not in known]
    if not chosen or unknown:
        raise UsageError(
            f"unknown size {', '.join(unknown) or repr(sizes)}: choose from {', '.join(known)}"
        )
    return chosen


def _check_json(json_path: Path, force: bool) -> None:
    """OutputError when --json FILE exists (without --force) or its directory does not."""
    if json_path.exists() and not force:
        raise OutputError(f"{shown(json_path)} exists (use --force to overwrite)")
    if not json_path.parent.is_dir():
        raise OutputError(f"output directory {shown(json_path.parent)} does not exist")


def _need_gpu() -> None:
    """DeviceError (exit 5) without a usable GPU, saying bench needs one."""
    try:
        resolve_backend(Backend.cuda)
    except DeviceError as e:
        problem = str(e).replace("--backend cuda: ", "")
        raise DeviceError(f"bench needs an NVIDIA GPU: {problem}") from None


def _pipeline(quick: bool, json_path: Path | None) -> None:
    """--pipeline: benchmarks/pipeline.py's table; its exit code if not 0."""
    argv = (["--quick"] if quick else []) + (["--json", str(json_path)] if json_path else [])
    rc = harness_module("pipeline").main(argv)
    if rc:
        raise typer.Exit(rc)
