"""The filtering commands' work, `blur`, `filter`, `contour` and the named filters
(`gaussian`, `edges`, `sharpen`: `NAMED`), without Typer.

`run(op, options)` is each command's body, given the options as Typer parsed them (the
commands declared in `filters`). One input is read, filtered and written here
(`filter_file`); several go through many.run_many (`_filter_many`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from .. import files
from ..errors import InputError, OutputError, UsageError
from . import many
from .output import PROG, describe, info, note, shown, stage
from .values import (
    Backend,
    Method,
    border_value,
    check_gpu_first,
    check_method,
    engine,
    gpu_bytes,
    note_unused_method,
    parse_kernel,
    resolve_backend,
)

Apply = Callable[..., Any]  # (image, backend name, out=None) -> filtered image

# Each command: the imgfilter.api function it calls, and that function's arguments
# after the image, from the parsed options.
OPS: dict[str, tuple[str, Callable[[dict[str, Any]], tuple]]] = {
    "blur": ("blur", lambda o: (o["k"],)),
    "filter": ("filter2d", lambda o: (parse_kernel(o["kernel"], o["normalize"]),)),
    "contour": ("contour", lambda o: ()),
}


def _gaussian_args(o: dict[str, Any]) -> tuple:
    """gaussian's (ksize, sigma_x, sigma_y), checked before any input is read."""
    k, sigma, sigma_y = o["k"], o["sigma"], o["sigma_y"]
    if k % 2 == 0 and k != 0:
        raise UsageError(f"--k must be odd (or 0: from --sigma), got {k}")
    if k == 0 and sigma <= 0:
        raise UsageError("give --k K (odd), --sigma S (> 0), or both")
    _named_kernel(k, sigma, sigma_y)
    return k, sigma, sigma_y


def _sharpen_args(o: dict[str, Any]) -> tuple:
    """sharpen's (sigma, amount, threshold), checked before any input is read."""
    if o["sigma"] <= 0:
        raise UsageError(f"--sigma must be > 0, got {o['sigma']:g}")
    _named_kernel(0, o["sigma"], 0.0)
    return o["sigma"], o["amount"], o["threshold"]


def _edges_args(o: dict[str, Any]) -> tuple:
    """edges' (ksize, result dtype): the Sobel side, checked, and uint8."""
    if o["k"] % 2 == 0:
        raise UsageError(f"--k must be odd (1, 3, 5, ... 31), got {o['k']}")
    return o["k"], "uint8"


def _named_kernel(k: int, sigma: float, sigma_y: float) -> Any:
    """The kernel of the Gaussian these options make for an 8-bit image (the smallest
    from a sigma: 3 sigma each side): UsageError for options no image could take."""
    from .. import named

    return named.gaussian_kernel(k, sigma, sigma_y, "uint8")


# The named filters (imgfilter.named): each is filter2d with a kernel, so --method takes
# filter2d's. Each: the function, its arguments after the image from the options, and
# (of those arguments) the kernel taps that `imgfilter.placement` places an image by.
NAMED: dict[str, tuple[str, Callable[[dict[str, Any]], tuple], Callable[[tuple], int]]] = {
    "gaussian": ("gaussian", _gaussian_args, lambda a: _named_kernel(*a).size),
    "edges": ("gradient_magnitude", _edges_args, lambda a: 2 * max(3, a[0]) * a[0]),
    "sharpen": ("sharpen", _sharpen_args, lambda a: _named_kernel(0, a[0], 0.0).size),
}
# Operations whose result is not of the input's dtype.
RESULT_DTYPES = {"edges": "uint8"}


def run(op: str, options: dict[str, Any]) -> None:
    """The body of the filtering command `op` (a key of OPS), given its parsed options
    by name (as the Typer command declares them, `filters`): the filter from the
    options, then `filter_files`."""
    named = op in NAMED
    api_name, args_of = NAMED[op][:2] if named else OPS[op]
    border, method = options["border"], options["method"]
    check_method("filter2d" if named else api_name, method)
    value = border_value(border, options["border_value"])
    max_gpu_bytes = gpu_bytes(options["max_gpu_memory"])
    args = args_of(options)

    def apply(img: Any, backend_name: str, out: Any = None) -> Any:
        from .. import api
        from .. import named as named_filters

        return getattr(named_filters if named else api, api_name)(
            img, *args, border=border.value, border_value=value, backend=backend_name,
            method=method.value, max_gpu_bytes=max_gpu_bytes, out=out,
        )  # fmt: skip

    outs = many.Outputs(**{f.name: options[f.name] for f in fields(many.Outputs)})
    cluster = (options["gpus"], options["scheduler"])
    taps = int(args[0].size) if op == "filter" else NAMED[op][2](args) if named else 0
    filter_files(op, outs, backend=options["backend"], method=method, apply=apply,
                 cluster=cluster, taps=taps)  # fmt: skip


# ------------------------------------------------------------------------ one input


def filter_files(
    op: str,
    outs: many.Outputs,
    *,
    backend: Backend,
    method: Method,
    apply: Apply,
    cluster: tuple[int | None, str | None] = (None, None),
    taps: int = 0,
) -> None:
    """One input: `filter_file` (with --out-dir/--name naming its output); several, a
    directory or a pattern: `_filter_many` (on a Dask cluster with `cluster`: --gpus,
    --scheduler; `taps`: the filter kernel's, for `imgfilter.placement`). UsageError
    for options that exclude each other or a bad --name."""
    template = outs.name if outs.name is not None else files.default_template(op)

    def check_name() -> None:
        if outs.name is not None:
            files.check_template(template, op)

    many.check_outputs(outs, check_name)
    if outs.out_dir is not None:
        many.make_out_dir(outs.out_dir)
    if not many.single(outs.images):
        _filter_many(op, outs, template, backend=backend, method=method, apply=apply,
                     cluster=cluster, taps=taps)  # fmt: skip
        return
    if cluster != (None, None):
        note("one input is filtered here; --gpus and --scheduler apply to several")
    image, output = outs.images[0], outs.output
    if outs.out_dir is not None or outs.name is not None:
        entry = files.Entry(image)
        output = files.target_for(entry, op=op, out_dir=outs.out_dir, template=template)
    if outs.skip_existing:
        target = output if output is not None else _default_output(image, op)
        if os.path.lexists(target):
            info(f"{PROG}: {shown(target)} exists; skipped (--skip-existing)")
            return
    filter_file(
        op, image, output, force=outs.force, backend=backend, method=method, apply=apply,
        quality=outs.quality, keep_metadata=outs.keep_metadata,
    )  # fmt: skip


def _default_output(image: Path, op: str) -> Path:
    from .. import io

    return io.default_output(image, op)


def _result_dtype(op: str, img: Any) -> Any:
    """The dtype of `op`'s result on `img`: the image's, but for RESULT_DTYPES."""
    import numpy as np

    return np.dtype(RESULT_DTYPES.get(op, img.dtype))


def _result_channels(op: str, img: Any, source: Path, error: type[Exception]) -> int:
    """Channels of `op`'s result on `img`; `error` for contour on a float image."""
    if op != "contour":
        return 1 if img.ndim == 2 else int(img.shape[2])
    if img.dtype.kind == "f":
        raise error(f"contour needs an integer image (uint8 or uint16); {source} is float")
    return 1


def _no_metadata_note(kind: str) -> str:
    from .. import io

    return (
        f"--keep-metadata: {kind} outputs are written without EXIF or ICC profile "
        f"(kept for {', '.join(io.METADATA_FORMATS)})"
    )


def filter_file(
    op: str,
    image: Path,
    output: Path | None,
    *,
    force: bool,
    backend: Backend,
    method: Method,
    apply: Apply,
    quality: int | None = None,
    keep_metadata: bool = False,
) -> None:
    """Read INPUT, validate OUT (default INPUT_STEM.OP.EXT) for the result's dtype and
    channels, filter, write, one `wrote` line."""
    check_gpu_first(backend)
    from .. import io, placement
    from ..backends import warmup

    on_cpu = _one_image_on_cpu(op, image, backend, method)
    if not on_cpu:
        warmup.start_for(op, backend.value)
    stage(f"reading {shown(image)}")
    img = io.read_image(image)
    channels = _result_channels(op, img, image, UsageError)
    target = output if output is not None else io.default_output(image, op)
    _check_extension(target)
    target = io.check_output(
        target, input_path=image, overwrite=force, dtype=_result_dtype(op, img),
        channels=channels, quality=quality,
    )  # fmt: skip
    metadata = _metadata(image, target) if keep_metadata else None
    # Resolved only now, so that the "using the CPU backend" note of --backend auto
    # never comes before a one-line input or output error.
    if on_cpu and placement.first_image_on_cpu(op, img):
        backend_name, shown_engine = "cpu", f"cpu: one {op}, done before a GPU could start"
    else:
        backend_name = resolve_backend(backend)
        shown_engine = engine(backend_name, method)
    note_unused_method(backend_name, method)
    stage(f"{op} on {backend_name}")
    if io.is_npy_path(target) and _result_bytes(op, img) > available_memory() // 2:
        written, out, ms = _filter_into_npy(op, img, target, apply, backend_name, force)
    else:
        start = time.perf_counter()
        out = apply(img, backend_name)
        ms = (time.perf_counter() - start) * 1e3
        stage(f"writing {shown(target)}")
        written = io.write_image(target, out, overwrite=force, quality=quality,
                                 metadata=metadata)  # fmt: skip
    # The first call in this process: the time includes loading (or compiling) the
    # kernels, not Python's or Numba's imports (`imgfilter compare` times a warm call).
    info(
        f"wrote {shown(written)} ({describe(out)}, {shown_engine}, "
        f"filtered in {ms:.1f} ms incl. kernel loading)"
    )


def _check_extension(target: Path) -> None:
    """OutputError for an output file name without an extension (`-o out`), which
    would name no format."""
    from .. import io

    if not target.suffix and str(target) != "-" and not target.is_dir():
        raise OutputError(
            f"cannot write {target}: the output needs an extension naming its format, "
            f"one of {', '.join(io.SUPPORTED_WRITE_EXTENSIONS)}"
        )


def _one_image_on_cpu(op: str, image: Path, backend: Backend, method: Method) -> bool:
    """Whether --backend auto may run this one image on the CPU: a blur or a contour
    (`warmup.DEFERRED_COMMANDS`) without --method, of an image that
    `warmup.one_image_on_cpu` lets the CPU run; the pixels read then go where
    `imgfilter.placement` puts them."""
    from ..backends import warmup

    if op not in warmup.DEFERRED_COMMANDS or backend is not Backend.auto:
        return False
    return method is Method.auto and warmup.one_image_on_cpu(image, op)


def _result_bytes(op: str, img: Any) -> int:
    """Bytes of `op`'s result on `img` (contour: one channel)."""
    channels = 1 if op == "contour" or img.ndim == 2 else img.shape[2]
    return img.shape[0] * img.shape[1] * channels * _result_dtype(op, img).itemsize


def available_memory() -> int:
    """Bytes of host memory a new allocation can take without swapping: Linux's
    MemAvailable (free memory plus the page cache it can drop), else the free pages,
    else all physical memory."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            return os.sysconf(name) * os.sysconf("SC_PAGE_SIZE")
    return 0


def _filter_into_npy(
    op: str, img: Any, target: Path, apply: Apply, backend_name: str, force: bool
) -> tuple[Path, Any, float]:
    """A .npy output whose result would take more than half the host's available
    memory: the filter writes it straight into the new file (a memory map of it,
    `io.write_npy_from`), so an image larger than the host's memory goes from a
    memory-mapped .npy input to a .npy output without either being held in RAM.
    Smaller results are made in memory and then written, which is faster (writing
    through the map faults its pages in one by one: a 1.2 GB blur 0.2-0.5 s slower on
    an H100 host). Returns (path written, the result as a map of that file, filter ms)."""
    from .. import io

    shape = img.shape[:2] if op == "contour" else img.shape
    done: dict[str, Any] = {}

    def fill(array: Any) -> None:
        start = time.perf_counter()
        apply(img, backend_name, out=array)
        done["ms"] = (time.perf_counter() - start) * 1e3
        done["out"] = array
        stage(f"writing {shown(target)}")

    written = io.write_npy_from(target, shape, _result_dtype(op, img), fill, overwrite=force)
    return written, done["out"], done["ms"]


def _metadata(image: Path, target: Path) -> Any:
    """--keep-metadata: the input's EXIF and ICC profile, and a note where the output
    cannot hold them or the input has none."""
    from .. import io

    meta = io.read_metadata(image)
    kind = io.format_for(target).name
    if kind not in io.METADATA_FORMATS:
        note(_no_metadata_note(kind))
        return None
    if not meta:
        note(f"--keep-metadata: {shown(image)} has no EXIF or ICC profile to keep")
    return meta


# ---------------------------------------------------------------------- many inputs


@contextlib.contextmanager
def _files_client(op: str, backend: Backend, cluster: tuple[int | None, str | None], jobs: int):
    """The Dask client many files run on (--gpus or --scheduler), or None: threads here,
    the GPU checked and warmed up first."""
    if cluster == (None, None):
        from ..backends import warmup

        check_gpu_first(backend)
        warmup.start_for(op, backend.value)
        yield None
        return
    from .. import cluster as dask_cluster

    with dask_cluster.connect(*cluster, jobs=jobs) as client:
        yield client


def _filter_many(
    op: str,
    outs: many.Outputs,
    template: str,
    *,
    backend: Backend,
    method: Method,
    apply: Apply,
    cluster: tuple[int | None, str | None] = (None, None),
    taps: int = 0,
) -> None:
    """Filter many files: many.plan_many, then many.run_many with the filter (on a Dask
    cluster with --gpus or --scheduler)."""
    with _files_client(op, backend, cluster, outs.jobs) as client:
        _run_files(op, outs, template, backend=backend, method=method, apply=apply,
                   client=client, taps=taps)  # fmt: skip


def _run_files(op: str, outs: many.Outputs, template: str, *, backend: Backend, method: Method,
               apply: Apply, client: Any, taps: int = 0) -> None:  # fmt: skip
    """`_filter_many`'s work on its runner: threads here (client None) or a Dask client.
    Each image goes where `imgfilter.placement` puts it: on the CPU, on the codec thread
    that decoded it; else on the resolved backend in the filter threads (without a GPU
    that is the CPU too, one image at a time, each filter using every core)."""
    import numpy as np

    from .. import io, placement
    from ..backends import cpu as cpu_backend

    plan, problems = many.plan_many(op, outs, template)
    backend_name = resolve_backend(backend) if plan.jobs else backend.value
    if plan.jobs:
        note_unused_method(backend_name, method)
    noted: set[str] = set()  # output formats whose loss of metadata was noted
    # Resolved to the CPU, --backend and --method choose nothing more: the rule as for auto.
    asked = (backend.value, method.value) if backend_name == "cuda" else ("auto", "auto")
    used: set[str] = set()  # the backends that filtered

    def load(job: files.Job) -> Any:
        many.refuse_existing(job.targets, force=outs.force, skip_existing=outs.skip_existing)
        img = io.read_image(job.source)
        channels = _result_channels(op, img, job.source, InputError)
        io.check_format(job.target, dtype=_result_dtype(op, img), channels=channels,
                        quality=outs.quality)  # fmt: skip
        return img, _many_metadata(job, noted) if outs.keep_metadata else None

    def here(job: files.Job, loaded: Any) -> bool:
        return placement.on_cpu(op, loaded[0], *asked, taps=taps)

    def compute(job: files.Job, loaded: Any) -> Any:
        img = loaded[0]
        if here(job, loaded):  # on the codec thread: every CPU is busy with an image
            used.add("cpu")
            with cpu_backend.unbanded():
                return many.on_device(lambda: apply(img, "cpu"))
        used.add(backend_name)
        return many.on_device(lambda: apply(img, backend_name))

    def engines() -> str:
        return " + ".join(engine(name, method) for name in sorted(used)) or engine(
            backend_name, method
        )

    # Here, output folders are fsynced once at the end; on a Dask cluster the saves run
    # in other processes and each write syncs its own folder.
    synced = io.DirectorySync() if client is None else None
    local = client is None  # (the closures run on a cluster must not hold the client)

    def save(job: files.Job, loaded: Any, result: Any) -> Any:
        many.make_parent(job.target)
        rest = io.stage_image(
            job.target, np.asarray(result), overwrite=outs.force, quality=outs.quality,
            metadata=loaded[1], directories=synced,
        )  # fmt: skip
        return rest if local else rest()  # here: fsync and rename on a sync thread

    try:
        many.run_many(
            op, plan, problems, jobs=outs.jobs, engine=engines, load=load, compute=compute,
            save=save, client=client, here=here, gpu=backend_name == "cuda",
        )  # fmt: skip
    finally:
        if synced is not None:
            synced.flush()


def _many_metadata(job: Any, noted: set[str]) -> Any:
    """--keep-metadata for one of many files: its EXIF and ICC profile, or None and a
    note (once per output format) where the output cannot hold them."""
    from .. import io

    kind = io.format_for(job.target).name
    if kind in io.METADATA_FORMATS:
        return io.read_metadata(job.source)
    if kind not in noted:
        noted.add(kind)
        note(_no_metadata_note(kind))
    return None
