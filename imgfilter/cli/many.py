"""Several inputs in one command: the CLI's side of imgfilter.files.

`check_outputs` checks how the outputs are named (-o, --out-dir, --name);
`plan_many` expands the inputs and plans the outputs; `run_many` runs the plan through
files.run_pipeline with a progress bar, one line per failed file, a summary and the
exit code. The filtering commands and `classify` give it their `load`, `compute` and
`save`.
"""

from __future__ import annotations

import contextlib
import io as _text_io
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import files
from ..errors import DeviceError, ImgFilterError, OutputError, UsageError
from .output import PROG, Run, emit, fail, info, note, one_line, shown
from .worker import Exit, gpu_failure, is_terminal


@dataclass
class Outputs:
    """What the filtering commands take besides their filter: inputs and outputs."""

    images: list[Path]
    output: Path | None
    out_dir: Path | None = None
    name: str | None = None
    recursive: bool = False
    jobs: int | None = None
    skip_existing: bool = False
    force: bool = False
    quality: int | None = None
    keep_metadata: bool = False


def single(images: list[Path]) -> bool:
    """One input that is a file (or names none): the one-file command."""
    if len(images) != 1:
        return False
    from ..files import has_magic

    p = images[0]
    return not p.is_dir() and not (has_magic(str(p)) and not os.path.lexists(p))


def check_outputs(outs: Outputs, check_name: Callable[[], None]) -> None:
    """UsageError for options that exclude each other, in this order: --force and
    --skip-existing; a bad --name (`check_name` raises); -o and --out-dir/--name; -o
    with several inputs."""
    if outs.force and outs.skip_existing:
        raise UsageError("--force and --skip-existing exclude each other")
    check_name()
    if outs.output is not None and (outs.out_dir is not None or outs.name is not None):
        raise UsageError("-o names the output itself: give either -o or --out-dir/--name")
    if outs.output is not None and not single(outs.images):
        raise UsageError(
            "-o names one output file; for several inputs give --out-dir and/or --name"
        )


def make_out_dir(out_dir: Path) -> None:
    """Create --out-dir (and its parents); OutputError when it cannot be."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"--out-dir {out_dir}: it is a file, not a directory") from None
    except OSError as e:
        raise OutputError(f"--out-dir {out_dir}: cannot create it: {e.strerror or e}") from None


def make_parent(target: Path) -> None:
    """Create the directory an output goes into; OutputError when it cannot be."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot write {target}: {e.strerror or e}") from e


def plan_many(
    op: str,
    outs: Outputs,
    template: str,
    *,
    extras: tuple[Any, ...] = (),
    what: str = "output",
) -> tuple[Any, list[str]]:
    """Expand the inputs and plan the outputs (files.expand, files.make_plan): a usage
    error for colliding outputs, a line per argument that names nothing, a note for
    earlier results left out; exit now when there is nothing to do. Returns the plan
    and the lines about the arguments that named nothing."""
    entries, problems = files.expand([str(p) for p in outs.images], recursive=outs.recursive)
    plan = files.make_plan(
        entries, op=op, out_dir=outs.out_dir, template=template, extras=extras, what=what
    )
    for problem in problems:
        fail(problem)
    if not plan.jobs and not plan.left_out:  # nothing to do: the lines above say why
        raise Exit(3 if problems else 0)
    if plan.left_out:
        example, source = plan.left_out[0]
        note(
            f"left out {len(plan.left_out)} file(s) found that other inputs' outputs "
            f"would replace (earlier results), e.g. {shown(example)} of {shown(source)}"
        )
    return plan, problems


def on_device(fn: Callable[[], Any]) -> Any:
    """fn() (an image's filter, wherever it runs), a GPU failure made files.Fatal (the
    run stops); a GPU allocation that failed fails this image only (the next one may
    fit)."""
    from ..errors import GpuMemoryError

    try:
        return fn()
    except GpuMemoryError:
        raise
    except DeviceError as e:
        raise files.Fatal(e) from e
    except Exception as e:
        if gpu_failure(e):
            raise files.Fatal(e) from e
        raise


def refuse_existing(targets: tuple[Path, ...], *, force: bool, skip_existing: bool) -> set[Path]:
    """The outputs of one input that exist: files.Skip when all do and --skip-existing
    (the others are then written, these kept), OutputError without --force."""
    if force:
        return set()
    existing = {t for t in targets if os.path.lexists(t)}
    if existing and skip_existing:
        if len(existing) == len(targets):
            raise files.Skip()
        return existing
    if existing:
        first = next(t for t in targets if t in existing)
        raise OutputError(
            f"{first} exists",
            cli_message=f"{shown(first)} exists; pass --force to overwrite it "
            "or --skip-existing to keep it",
        )
    return set()


class Bar:
    """The many-files progress bar on stderr (a terminal): files done/total, images/s,
    MB/s of input, ETA. Lines printed meanwhile go above it; erased at the end."""

    def __init__(self, op: str, total: int, stream: Any) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(file=stream),
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._task = self._progress.add_task(op, total=total, rate="")
        self._progress.start()

    def update(self, done: int, rate: str) -> None:
        self._progress.update(self._task, completed=done, rate=rate)

    def print(self, line: str) -> None:
        self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def stop(self) -> None:
        self._progress.stop()


def _error_stream() -> tuple[Any, bool]:
    """Where many-files lines go: a duplicate of descriptor 2 taken now (the decoders
    point descriptor 2 at a temporary file while they run, from several threads), or
    sys.stderr itself when it is not descriptor 2 (a test's capture). Returns the
    stream and whether it is ours to close."""
    try:
        real = sys.stderr.fileno() == 2
    except (AttributeError, ValueError, OSError, _text_io.UnsupportedOperation):
        real = False
    if not real:
        return sys.stderr, False
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    return os.fdopen(os.dup(2), "w", buffering=1), True


@contextlib.contextmanager
def _many_lines(op: str, total: int) -> Iterator[None]:
    """While many files are processed: lines on `_error_stream`, the progress bar on a
    terminal (without --quiet), no spinner; all undone at the end."""
    stream, owned = _error_stream()
    Run.many = True
    Run.err = stream
    try:
        if total and not Run.quiet and is_terminal(sys.stderr):
            with Run.lock:
                Run.bar = Bar(op, total, stream)
        yield
    finally:
        with Run.lock:
            if Run.bar is not None:
                with contextlib.suppress(Exception):
                    Run.bar.stop()
                Run.bar = None
        Run.err = None
        Run.many = False
        if owned:
            with contextlib.suppress(OSError):
                stream.close()


def _rate(done: int, nbytes: int, seconds: float) -> str:
    if seconds <= 0 or done == 0:
        return ""
    return f"{done / seconds:.1f} img/s, {nbytes / seconds / 1e6:.1f} MB/s"


def _failure_kind(error: BaseException) -> str:
    """input, output, device or other: which exit code a failed file asks for."""
    from ..errors import InputError

    if isinstance(error, (InputError, UsageError)):
        return "input"
    if isinstance(error, OutputError):
        return "output"
    if isinstance(error, DeviceError) or (isinstance(error, Exception) and gpu_failure(error)):
        return "device"
    return "other"


def _failure_line(source: Path, error: BaseException) -> str:
    """The error line of one failed file, naming it where the message does not."""
    if not isinstance(error, ImgFilterError):
        return f"{shown(source)}: unexpected {type(error).__name__}: {error}"
    message = error.cli_message or str(error)
    if isinstance(error, DeviceError) and shown(source) not in message:
        message = f"{shown(source)}: {message}"
    return message


def _summary(stats: Any, failed: int, engine: str, seconds: float) -> str:
    """`imgfilter: N written, N skipped, N failed[, N not started] (ENGINE, S s[, rate])`."""
    rate = _rate(stats.written, stats.bytes_in, seconds) if stats.written else ""
    not_started = stats.total - stats.done
    return (
        f"{PROG}: {stats.written} written, {stats.skipped} skipped, {failed} failed"
        + (f", {not_started} not started" if not_started else "")
        + f" ({engine}, {seconds:.2f} s"
        + (f", {rate})" if rate else ")")
    )


def _exit_code(fatal: BaseException | None, failures: Counter) -> int:
    """5 after a fatal GPU failure, else 3 if an input failed, else 4 if an output
    failed, else 5 (a GPU allocation), else 1 (anything else), else 0."""
    if fatal is not None:
        return DeviceError.exit_code
    for kind, code in (("input", 3), ("output", OutputError.exit_code),
                       ("device", DeviceError.exit_code), ("other", 1)):  # fmt: skip
        if failures[kind]:
            return code
    return 0


# Threads that filter on the GPU at once. Each waits for its image's copies and kernels
# and so spends little CPU time; several keep the copies of one image overlapping
# another's kernel.
GPU_FILTER_THREADS = 8


def filter_threads(gpu: bool, workers: int) -> int:
    """Threads that filter the images not filtered on their codec thread: on the GPU up
    to GPU_FILTER_THREADS, on the CPU one (its filters use every core already)."""
    return min(GPU_FILTER_THREADS, workers) if gpu else 1


TIMINGS_ENV = "IMGFILTER_TIMINGS"
# Stages in the order of an image's way through the pipeline, as the timings line
# names them (a stage that no image went through is left out). A filter in a filter
# thread is the whole of a GPU filter (upload, kernels, download) or of a costly one
# on the CPU.
_STAGE_NAMES = {
    files.READ: "read+decode",
    files.FILTER_HERE: "filter on the codec thread",
    files.FILTER_THREAD: "filter in a filter thread",
    files.WRITE: "encode+write",
    files.SYNC: "fsync+rename on a sync thread",
}


def timings_line(stats: Any, seconds: float) -> str:
    """`imgfilter: timings: STAGE MS ms x N, ...; codec threads W busy P%, filter
    threads F busy Q%`: each stage's mean milliseconds per image that went through it,
    and how busy each pool of threads was over the run's `seconds` (IMGFILTER_TIMINGS)."""
    clock = stats.timings
    parts = []
    for stage in _STAGE_NAMES:
        n = clock.counts.get(stage, 0)
        if n:
            ms = clock.seconds[stage] / n * 1e3
            parts.append(f"{_STAGE_NAMES[stage]} {ms:.1f} ms x {n}")
    codec = sum(clock.seconds.get(s, 0.0) for s in (files.READ, files.FILTER_HERE, files.WRITE))
    wall = max(seconds, 1e-9)
    pools = f"codec threads {stats.workers} busy {100 * codec / (stats.workers * wall):.0f}%"
    if clock.counts.get(files.FILTER_THREAD):
        busy = clock.seconds[files.FILTER_THREAD] / (stats.filters * wall)
        pools += f", filter threads {stats.filters} busy {100 * busy:.0f}%"
    return f"{PROG}: timings: {', '.join(parts) or 'no image read'}; {pools}"


def run_many(
    op: str,
    plan: Any,
    problems: list[str],
    *,
    jobs: int | None,
    engine: str | Callable[[], str],
    load: Callable[[Any], Any],
    compute: Callable[[Any, Any], Any],
    save: Callable[[Any, Any, Any], None],
    client: Any = None,
    here: Callable[[Any, Any], bool] | None = None,
    gpu: bool = False,
) -> None:
    """Run the plan through files.run_pipeline (`jobs` codec threads; compute on the
    codec thread where `here(job, loaded)`, else on `filter_threads(gpu, ...)`
    threads; each stage timed), or with a Dask
    `client` through cluster.run_on_cluster (a task per file): a line per failed file,
    a summary (`engine`: what filtered, or a function that says it once the run is
    over), the stages' times with IMGFILTER_TIMINGS=1, then exit 3 if an input failed
    (or an argument named nothing: `problems`), else 4 if an output failed, else 5
    (GPU), else 1."""
    failures: Counter = Counter()
    start = time.monotonic()

    def on_event(kind: str, job: files.Job, error: BaseException | None, stats: Any) -> None:
        if error is not None:
            failures[_failure_kind(error)] += 1
            emit(f"{PROG}: error: {one_line(_failure_line(job.source, error))}")
        if Run.bar is not None:
            elapsed = time.monotonic() - start
            Run.bar.update(stats.done, _rate(stats.done, stats.bytes_in, elapsed))

    with _many_lines(op, len(plan.jobs)):
        if client is not None:
            from .. import cluster

            stats = cluster.run_on_cluster(
                client, plan.jobs, load=load, compute=compute, save=save, on_event=on_event
            )
        else:
            workers = jobs or files.default_workers()
            stats = files.run_pipeline(
                plan.jobs, load=load, compute=compute, save=save, workers=workers,
                on_event=on_event, filters=filter_threads(gpu, workers), here=here,
            )  # fmt: skip
    seconds = time.monotonic() - start
    failures["input"] += len(problems)
    shown_engine = engine() if callable(engine) else engine
    info(_summary(stats, stats.failed + len(problems), shown_engine, seconds))
    if os.environ.get(TIMINGS_ENV, "") not in ("", "0") and client is None:
        emit(timings_line(stats, seconds))
    if stats.fatal is not None:
        fail(f"the GPU failed: {stats.fatal}; stopped (try --backend cpu)")
    code = _exit_code(stats.fatal, failures)
    if code:
        raise Exit(code)
