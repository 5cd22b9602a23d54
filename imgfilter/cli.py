"""The `imgfilter` command: parse options, call the array API, report. Thin.

    imgfilter blur INPUT... --k K [-o OUT | --out-dir DIR --name TEMPLATE]
    imgfilter filter INPUT... --kernel SPEC [--normalize] [-o OUT | --out-dir DIR ...]
    imgfilter contour INPUT... [-o OUT | --out-dir DIR ...]
    imgfilter compare INPUT (--k K | --kernel SPEC [--normalize] | --contour) [--json]

Every error is one line on stderr, `imgfilter: error: <message>`, with the exit code of
its class (imgfilter.errors: 2 usage, 3 input, 4 output, 5 device; 1 anything else);
`--debug` adds the traceback. Click's own usage errors are reported the same way.
Ctrl-C ends a command within a fraction of a second: one line `imgfilter: interrupted`,
exit 130, no output or temporary file left (see `_in_worker`).
Informational lines (what was written, notes) go to stderr too; `--quiet` drops them.
Heavy modules (numba, cv2, imgfilter.io, the backends) are imported inside the
commands, so `imgfilter --help` stays quick.
"""

from __future__ import annotations

import contextlib
import functools
import io as _text_io
import json
import math
import os
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

try:  # recent Typer vendors Click as typer._click; older Typer depends on Click.
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - depends on the installed Typer
    from click import exceptions as click_exc

from . import __version__
from .api import MAX_BOX_SIDE, METHODS  # imgfilter/__init__ has imported api already
from .backends import BACKENDS
from .border import BORDERS
from .errors import DeviceError, ImgFilterError, OutputError, UsageError

PROG = "imgfilter"

Border = Enum("Border", {name: name for name in BORDERS}, type=str)
Backend = Enum("Backend", {name: name for name in BACKENDS}, type=str)
Method = Enum("Method", {name: name for name in METHODS}, type=str)


def _one_line(message: str) -> str:
    """Collapse a message onto one line (some library messages span several)."""
    parts = [line.strip() for line in str(message).splitlines() if line.strip()]
    return "; ".join(parts) or "(no message)"


def _fail(message: str) -> None:
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)


class _OneLineErrors(TyperGroup):
    """Report Click's usage errors (bad option values, unknown options) as one line, exit 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args, prog_name or PROG, complete_var, standalone_mode=False, **extra)
        except click_exc.NoArgsIsHelpError as e:
            # `imgfilter` alone: the help, on stderr, then exit 2 as Click does.
            e.show()
            rv = e.exit_code
        except click_exc.ClickException as e:
            # Typer validates through pydantic, whose messages start "Value error, ".
            message = e.format_message().replace("Value error, ", "").rstrip(".")
            ctx = getattr(e, "ctx", None)
            if isinstance(e, click_exc.UsageError) and ctx is not None:
                message = f"{message} (see '{ctx.command_path} --help')"
            _fail(message)
            rv = e.exit_code
        except typer.Abort as e:
            if isinstance(e.__cause__, KeyboardInterrupt):  # Click < 8.2-style Ctrl-C
                _interrupted_line()
                rv = INTERRUPTED
            else:
                print(f"{PROG}: aborted", file=sys.stderr)
                rv = 1
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)

    def get_params(self, ctx: Any) -> list[Any]:
        return _clean_help_params(super().get_params(ctx))

    def invoke(self, ctx: Any) -> Any:
        # Ctrl-C while a command runs in this thread (a command run outside the main
        # thread, or a KeyboardInterrupt raised by the command itself): one line, 130.
        # Typer and Click would turn it into a silent exit 130 or "Aborted!".
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            _interrupted_line()
            raise typer.Exit(INTERRUPTED) from None


def _clean_help_params(params: list[Any]) -> list[Any]:
    """Help without Typer's value placeholders where there is no value to give: no
    `<bool>` after flags (-h/--help, --install-completion), no `{INPUT}` or `<path>`
    around an argument's metavar. (Our own flags set metavar="" for the same reason.)"""
    for param in params:
        kind = getattr(param, "param_type_name", "")
        if kind == "option" and getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        elif kind == "argument" and param.metavar:
            param.display_type_rich = _no_type  # Typer >= 0.28
            if hasattr(param, "type"):  # Typer < 0.28 prints <type> unless it is ""
                param.type.get_metavar = _no_metavar
    return params


class _CleanHelp(TyperCommand):
    """A command whose help shows `INPUT`, not `{INPUT}` and `<path>`, and flags such as
    `-h, --help` without `<bool>` (`_clean_help_params`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _clean_help_params(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)
        # `{INPUT}...` (several inputs) shows as INPUT too; the argument's help says more.
        pieces = [p[:-3] if p[:1] == "{" and p.endswith("}...") else p for p in pieces]
        return [p[1:-1] if p[:1] == "{" and p[-1:] == "}" else p for p in pieces]


def _no_type(*args: Any, **kwargs: Any) -> None:
    return None


def _no_metavar(*args: Any, **kwargs: Any) -> str:
    return ""


INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C

app = typer.Typer(
    name=PROG,
    cls=_OneLineErrors,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _app_command(name: str | None = None) -> Callable[..., Any]:
    return app.command(name, cls=_CleanHelp)


def _version(value: bool) -> None:
    if value:
        print(f"{PROG} {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            metavar="",
            callback=_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """GPU image filtering that matches OpenCV: box blur, filter2D, contour.

    Each command reads an image (PNG, JPEG, TIFF, ...), filters it on the GPU
    (CUDA) or the CPU, and writes INPUT_STEM.OP.EXT beside the input unless -o says
    otherwise. `compare` checks a result against OpenCV and times both.

    Examples:

      imgfilter blur photo.jpg --k 21

      imgfilter filter photo.jpg --kernel "-1,0,1;-2,0,2;-1,0,1" -o edges.png

      imgfilter contour photo.jpg --backend cpu

      imgfilter compare photo.jpg --k 21 --json

    Exit codes: 0 ok, 1 compare disagrees or unexpected error, 2 bad usage,
    3 input problem, 4 output problem, 5 GPU problem (none usable, out of memory, CUDA failure).
    """


# ------------------------------------------------------------------ running a command


class _Run:
    """The command being run: --quiet, and what it is doing (for the spinner)."""

    quiet = False
    stage = ""
    lock = threading.RLock()
    spinner: _Spinner | None = None
    bar: _Bar | None = None  # many files: the progress bar (no spinner then)
    many = False  # many files are being filtered: the spinner stays off
    err: Any = None  # where lines go instead of sys.stderr (many files: see _many_files)


def _info(line: str) -> None:
    """An informational line on stderr (not an error): dropped with --quiet."""
    if _Run.quiet:
        return
    _emit(line)


def _emit(line: str) -> None:
    """A line on stderr, above the spinner or the progress bar."""
    with _Run.lock:
        if _Run.bar is not None:
            _Run.bar.print(line)
            return
        if _Run.spinner is not None:
            _Run.spinner.stop()  # the line goes above; the spinner comes back next tick
        stream = _Run.err if _Run.err is not None else sys.stderr
        print(line, file=stream, flush=True)


def _note(message: str) -> None:
    _info(f"{PROG}: {_one_line(message)}")


def _stage(text: str) -> None:
    _Run.stage = text


def _interrupted_line() -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    print(f"{PROG}: interrupted", file=sys.stderr, flush=True)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """imgfilter's notes (io.MultiFrameWarning) as one line; other warnings as Python
    shows them."""
    if getattr(category, "cli_note", False):
        _note(str(message))
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning


class _Spinner:
    """A rich spinner on stderr (a terminal) with what the command is doing, shown once
    it has run for `DELAY` seconds, erased when it ends.

    It writes to a duplicate of file descriptor 2 taken before the command starts:
    while an image is decoded or encoded, imgfilter.io points descriptor 2 at a
    temporary file to catch the codecs' chatter, and the spinner must neither vanish
    into it nor become part of an error message read from it.
    """

    DELAY = 1.0

    def __init__(self) -> None:
        self._file = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
        self._progress: Any = None
        self._task: Any = None

    def tick(self, elapsed: float) -> None:
        if elapsed < self.DELAY or _Run.many:
            return
        with _Run.lock:
            if self._progress is None:
                from rich.console import Console
                from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

                self._progress = Progress(
                    SpinnerColumn(),
                    TextColumn("{task.description}"),
                    TimeElapsedColumn(),
                    console=Console(file=self._file),
                    transient=True,
                    redirect_stdout=False,
                    redirect_stderr=False,
                )
                self._task = self._progress.add_task(_Run.stage or "working", total=None)
                self._progress.start()
            self._progress.update(self._task, description=_Run.stage or "working")

    def stop(self) -> None:
        """Erase the spinner (it starts again at the next tick while the work goes on)."""
        if self._progress is not None:
            with contextlib.suppress(Exception):
                self._progress.stop()
            self._progress = None

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            self._file.close()


def _in_worker(fn: Callable[..., Any], args: Any, kwargs: Any, *, spinner: bool) -> Any:
    """Run fn(*args, **kwargs) in a worker thread; the main thread waits for it.

    Why: Python runs a signal handler only in the main thread, between bytecodes. A
    command that filtered in the main thread would sit in OpenCV or a Numba parallel
    loop (native code) for the whole of a long filter, and Ctrl-C would wait for it
    (19 s for an 8000x8000 31x31 filter on 2 cores). Those native calls release the
    GIL, so the main thread, waiting here with a timeout, gets KeyboardInterrupt at
    once. It cannot stop the worker (no thread can be cancelled inside native code),
    so it removes what an unfinished write left (io.abandon_io: the temporary file;
    outputs are renamed into place only when complete, so no partial output exists),
    prints one line and ends the process with os._exit(130): a normal exit would wait
    for the worker, or tear down Numba's and OpenCV's thread pools under it.
    The same loop drives the spinner.
    """
    if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)  # not where signals arrive: nothing to gain
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning
                outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:
            outcome["error"] = e

    worker = threading.Thread(target=work, name=f"{PROG}-command", daemon=True)
    show = _Spinner() if spinner and _is_terminal(sys.stderr) else None
    _Run.spinner = show
    start = time.monotonic()
    try:
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
            if show is not None and worker.is_alive():
                show.tick(time.monotonic() - start)
    except KeyboardInterrupt:
        _abandon(show)
    finally:
        _Run.spinner = None
        if show is not None:
            show.close()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _abandon(show: _Spinner | None) -> None:
    """Ctrl-C while the worker runs: clean up, say so, exit 130 now (see _in_worker)."""
    if show is not None:
        show.stop()
    if _Run.bar is not None:
        with contextlib.suppress(Exception):
            _Run.bar.stop()
    io = sys.modules.get(f"{__package__}.io")
    if io is not None:
        io.abandon_io()  # temp files gone, descriptor 2 back on the terminal
    _interrupted_line()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(INTERRUPTED)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError, OSError):
        return False


def _command(fn: Callable[..., Any] | None = None, *, spinner: bool = False) -> Any:
    """Run a command in a worker thread (Ctrl-C, the spinner: `_in_worker`), turning
    ImgFilterError into one stderr line and its exit code."""
    if fn is None:
        return functools.partial(_command, spinner=spinner)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = bool(kwargs.get("debug"))
        _Run.quiet = bool(kwargs.get("quiet"))
        _Run.stage = ""
        try:
            return _in_worker(fn, args, kwargs, spinner=spinner and not _Run.quiet)
        except (click_exc.ClickException, typer.Exit, typer.Abort):
            raise
        except ImgFilterError as e:
            if debug:
                traceback.print_exc()
            _fail(e.cli_message or str(e))
            raise typer.Exit(e.exit_code) from None
        except Exception as e:
            if debug:
                traceback.print_exc()
            if _gpu_failure(e):
                _fail(f"the GPU failed: {e}; try --backend cpu")
                raise typer.Exit(DeviceError.exit_code) from None
            hint = "" if debug else " (run with --debug for the traceback)"
            _fail(f"unexpected {type(e).__name__}: {e}{hint}")
            raise typer.Exit(1) from None

    return wrapper


def _gpu_failure(e: Exception) -> bool:
    """A CUDA error that reached the command (the driver's or Numba's), or a GPU
    allocation that failed: a device problem (exit 5), not an unexpected one."""
    from kernels.cudadrv import CudaError

    module = type(e).__module__
    return isinstance(e, CudaError) or module.startswith(("numba.cuda", "cuda."))


# Options shared by the filtering commands.
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
        help="cuda (Numba CUDA), cpu (Numba, parallel), or auto: cuda when a usable GPU exists.",
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
KeepMetadataOpt = Annotated[
    bool,
    typer.Option(
        "--keep-metadata",
        metavar="",
        help="Copy the input's EXIF and ICC colour profile into a JPEG, PNG or WebP "
        "output (orientation set to 1: the pixels are already upright).",
    ),
]
BoxSideOpt = Annotated[
    int,
    typer.Option(
        "--k",
        "-k",
        min=1,
        max=MAX_BOX_SIDE,
        metavar="K",
        help="Side of the square box in pixels (1 to 4095; even sizes as in OpenCV).",
    ),
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


def _border_value(border: Border, value: float | None) -> float:
    if value is None:
        return 0.0
    if border.value != "constant":
        raise UsageError(f"--border-value applies to --border constant, not {border.value}")
    if not math.isfinite(value):
        raise UsageError(f"--border-value must be finite, got {value}")
    return float(value)


def _resolve_backend(backend: Backend) -> str:
    """The backend that will run ("cuda"/"cpu"); DeviceError if cuda cannot.

    For auto without a usable GPU, get_backend notes the CPU fallback on stderr once.
    """
    from .backends import get_backend

    if _Run.quiet:  # the fallback note is informational
        with contextlib.redirect_stderr(_text_io.StringIO()):
            return get_backend(backend.value).NAME
    return get_backend(backend.value).NAME


def _describe(img: Any) -> str:
    h, w = img.shape[:2]
    c = 1 if img.ndim == 2 else img.shape[2]
    return f"{w}x{h} px, {c} ch {img.dtype}"


def _note_unused_method(backend_name: str, method: Method) -> None:
    """--method picks among CUDA kernels; say so when the CPU backend runs instead."""
    if backend_name == "cpu" and method.value != "auto":
        _note(
            f"--method {method.value} applies to the CUDA backend; "
            "the CPU backend has one implementation"
        )


def _engine(backend_name: str, method: Method) -> str:
    return f"{backend_name}/{method.value}" if backend_name == "cuda" else backend_name


def _shown(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _filter_file(
    op: str,
    image: Path,
    output: Path | None,
    *,
    force: bool,
    backend: Backend,
    method: Method,
    apply: Callable[[Any, str], Any],
    quality: int | None = None,
    keep_metadata: bool = False,
) -> None:
    """Read INPUT, validate OUT for the result's dtype/channels, filter, write, report."""
    if backend is Backend.cuda:
        _resolve_backend(backend)  # no usable GPU for --backend cuda: exit 5 before any I/O
    from . import io

    _stage(f"reading {_shown(image)}")
    img = io.read_image(image)
    channels = 1 if img.ndim == 2 else int(img.shape[2])
    if op == "contour":
        if img.dtype.kind == "f":
            raise UsageError(f"contour needs an integer image (uint8 or uint16); {image} is float")
        channels = 1
    target = output if output is not None else io.default_output(image, op)
    target = io.check_output(
        target,
        input_path=image,
        overwrite=force,
        dtype=img.dtype,
        channels=channels,
        quality=quality,
    )
    metadata = _metadata(image, target) if keep_metadata else None
    # Resolved only now, so that the "using the CPU backend" note of --backend auto
    # never comes before a one-line input or output error.
    backend_name = _resolve_backend(backend)
    _note_unused_method(backend_name, method)
    _stage(f"{op} on {backend_name}")
    start = time.perf_counter()
    out = apply(img, backend_name)
    ms = (time.perf_counter() - start) * 1e3
    _stage(f"writing {_shown(target)}")
    written = io.write_image(target, out, overwrite=force, quality=quality, metadata=metadata)
    # The first call in this process: the time includes loading (or compiling) the
    # kernels, not Python's or Numba's imports (`imgfilter compare` times a warm call).
    engine = _engine(backend_name, method)
    _info(
        f"wrote {_shown(written)} ({_describe(out)}, {engine}, "
        f"filtered in {ms:.1f} ms incl. kernel loading)"
    )


def _metadata(image: Path, target: Path) -> Any:
    """--keep-metadata: the input's EXIF and ICC profile, and a note where the output
    cannot hold them or the input has none."""
    from . import io

    meta = io.read_metadata(image)
    kind = io.format_for(target).name
    if kind not in io.METADATA_FORMATS:
        _note(
            f"--keep-metadata: {kind} outputs are written without EXIF or ICC profile "
            f"(kept for {', '.join(io.METADATA_FORMATS)})"
        )
        return None
    if not meta:
        _note(f"--keep-metadata: {_shown(image)} has no EXIF or ICC profile to keep")
    return meta


# ------------------------------------------------------------------------ many files


class _Many:
    """What the filtering commands take besides their filter: inputs and outputs."""

    def __init__(
        self,
        images: list[Path],
        output: Path | None,
        *,
        out_dir: Path | None = None,
        name: str | None = None,
        recursive: bool = False,
        jobs: int | None = None,
        skip_existing: bool = False,
        force: bool = False,
        quality: int | None = None,
        keep_metadata: bool = False,
    ) -> None:
        self.images = images
        self.output = output
        self.out_dir = out_dir
        self.name = name
        self.recursive = recursive
        self.jobs = jobs
        self.skip_existing = skip_existing
        self.force = force
        self.quality = quality
        self.keep_metadata = keep_metadata


def _single(images: list[Path]) -> bool:
    """One input that is a file (or names none): today's one-file command."""
    if len(images) != 1:
        return False
    from .files import has_magic

    p = images[0]
    return not p.is_dir() and not (has_magic(str(p)) and not os.path.lexists(p))


def _filter_files(
    op: str,
    many: _Many,
    *,
    backend: Backend,
    method: Method,
    apply: Callable[[Any, str], Any],
) -> None:
    """One input: `_filter_file` (with --out-dir/--name naming its output); several, a
    directory or a pattern: `_many_files`."""
    from . import files

    if many.force and many.skip_existing:
        raise UsageError("--force and --skip-existing exclude each other")
    template = many.name if many.name is not None else files.default_template(op)
    if many.name is not None:
        files.check_template(template, op)
    if many.output is not None and (many.out_dir is not None or many.name is not None):
        raise UsageError("-o names the output itself: give either -o or --out-dir/--name")
    if many.output is not None and not _single(many.images):
        raise UsageError(
            "-o names one output file; for several inputs give --out-dir and/or --name"
        )
    if many.out_dir is not None:
        _make_out_dir(many.out_dir)
    if not _single(many.images):
        _many_files(op, many, template, backend=backend, method=method, apply=apply)
        return
    image = many.images[0]
    output = many.output
    if many.out_dir is not None or many.name is not None:
        entry = files.Entry(image)
        output = files.target_for(entry, op=op, out_dir=many.out_dir, template=template)
    if many.skip_existing:
        target = output if output is not None else _default_output(image, op)
        if os.path.lexists(target):
            _info(f"{PROG}: {_shown(target)} exists; skipped (--skip-existing)")
            return
    _filter_file(
        op, image, output, force=many.force, backend=backend, method=method, apply=apply,
        quality=many.quality, keep_metadata=many.keep_metadata,
    )  # fmt: skip


def _default_output(image: Path, op: str) -> Path:
    from . import io

    return io.default_output(image, op)


def _make_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"--out-dir {out_dir}: it is a file, not a directory") from None
    except OSError as e:
        raise OutputError(f"--out-dir {out_dir}: cannot create it: {e.strerror or e}") from None


class _Bar:
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
    sys.stderr itself when it is not descriptor 2 (a test's capture)."""
    try:
        real = sys.stderr.fileno() == 2
    except (AttributeError, ValueError, OSError, _text_io.UnsupportedOperation):
        real = False
    if not real:
        return sys.stderr, False
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    return os.fdopen(os.dup(2), "w", buffering=1), True


def _rate(done: int, nbytes: int, seconds: float) -> str:
    if seconds <= 0 or done == 0:
        return ""
    return f"{done / seconds:.1f} img/s, {nbytes / seconds / 1e6:.1f} MB/s"


def _plan_many(
    op: str,
    many: _Many,
    template: str,
    *,
    extras: tuple[Any, ...] = (),
    what: str = "output",
) -> tuple[Any, list[str]]:
    """Expand the inputs and plan the outputs (files.expand, files.make_plan): a usage
    error for colliding outputs, a line per argument that names nothing, a note for
    earlier results left out; exit now when there is nothing to do."""
    from . import files

    entries, problems = files.expand([str(p) for p in many.images], recursive=many.recursive)
    plan = files.make_plan(
        entries, op=op, out_dir=many.out_dir, template=template, extras=extras, what=what
    )
    for problem in problems:
        _fail(problem)
    if not plan.jobs and not plan.left_out:  # nothing to do: the lines above say why
        raise typer.Exit(3 if problems else 0)
    if plan.left_out:
        example, source = plan.left_out[0]
        _note(
            f"left out {len(plan.left_out)} file(s) found that other inputs' outputs "
            f"would replace (earlier results), e.g. {_shown(example)} of {_shown(source)}"
        )
    return plan, problems


def _on_device(fn: Callable[[Any], Any]) -> Any:
    """fn(image) in the filter thread, a GPU failure made files.Fatal (the run stops);
    a GPU allocation that failed fails this image only (the next one may fit)."""
    from . import files
    from .errors import GpuMemoryError

    try:
        return fn()
    except GpuMemoryError:
        raise
    except DeviceError as e:
        raise files.Fatal(e) from e
    except Exception as e:
        if _gpu_failure(e):
            raise files.Fatal(e) from e
        raise


def _refuse_existing(targets: tuple[Path, ...], *, force: bool, skip_existing: bool) -> set[Path]:
    """The outputs of one input that exist: files.Skip when all do and --skip-existing
    (the others are then written, these kept), OutputError without --force."""
    from . import files

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
            cli_message=f"{_shown(first)} exists; pass --force to overwrite it "
            "or --skip-existing to keep it",
        )
    return set()


def _run_many(
    op: str,
    plan: Any,
    problems: list[str],
    *,
    jobs: int | None,
    engine: str,
    load: Callable[[Any], Any],
    compute: Callable[[Any, Any], Any],
    save: Callable[[Any, Any, Any], None],
) -> None:
    """Run the plan through files.run_pipeline: a line per failed file, a summary,
    exit 3 if an input failed, else 4 if an output failed, else 5 (GPU), else 1."""
    from . import files
    from .errors import InputError

    workers = jobs or files.default_workers()
    kinds = {"input": 0, "output": 0, "device": 0, "other": 0}
    start = time.monotonic()

    def on_event(kind: str, job: files.Job, error: BaseException | None, stats: Any) -> None:
        if error is not None:
            if isinstance(error, (InputError, UsageError)):
                kinds["input"] += 1
            elif isinstance(error, OutputError):
                kinds["output"] += 1
            elif isinstance(error, DeviceError) or (
                isinstance(error, Exception) and _gpu_failure(error)
            ):
                kinds["device"] += 1
            else:
                kinds["other"] += 1
            if isinstance(error, ImgFilterError):
                message = error.cli_message or str(error)
                if isinstance(error, DeviceError) and _shown(job.source) not in message:
                    message = f"{_shown(job.source)}: {message}"
            else:
                message = f"{_shown(job.source)}: unexpected {type(error).__name__}: {error}"
            _emit(f"{PROG}: error: {_one_line(message)}")
        if _Run.bar is not None:
            elapsed = time.monotonic() - start
            _Run.bar.update(stats.done, _rate(stats.done, stats.bytes_in, elapsed))

    stream, owned = _error_stream()
    _Run.many = True
    _Run.err = stream
    try:
        if plan.jobs and not _Run.quiet and _is_terminal(sys.stderr):
            with _Run.lock:
                _Run.bar = _Bar(op, len(plan.jobs), stream)
        stats = files.run_pipeline(
            plan.jobs, load=load, compute=compute, save=save, workers=workers,
            on_event=on_event,
        )  # fmt: skip
    finally:
        with _Run.lock:
            if _Run.bar is not None:
                with contextlib.suppress(Exception):
                    _Run.bar.stop()
                _Run.bar = None
        _Run.err = None
        _Run.many = False
        if owned:
            with contextlib.suppress(OSError):
                stream.close()
    seconds = time.monotonic() - start
    failed = stats.failed + len(problems)
    kinds["input"] += len(problems)
    rate = _rate(stats.written, stats.bytes_in, seconds) if stats.written else ""
    not_started = stats.total - stats.done
    summary = (
        f"{PROG}: {stats.written} written, {stats.skipped} skipped, {failed} failed"
        + (f", {not_started} not started" if not_started else "")
        + f" ({engine}, {seconds:.2f} s"
        + (f", {rate})" if rate else ")")
    )
    _info(summary)
    if stats.fatal is not None:
        _fail(f"the GPU failed: {stats.fatal}; stopped (try --backend cpu)")
        raise typer.Exit(DeviceError.exit_code)
    if kinds["input"]:
        raise typer.Exit(3)
    if kinds["output"]:
        raise typer.Exit(OutputError.exit_code)
    if kinds["device"]:
        raise typer.Exit(DeviceError.exit_code)
    if kinds["other"]:
        raise typer.Exit(1)


def _many_files(
    op: str,
    many: _Many,
    template: str,
    *,
    backend: Backend,
    method: Method,
    apply: Callable[[Any, str], Any],
) -> None:
    """Filter many files: `_plan_many`, then `_run_many` with the filter."""
    import numpy as np

    from . import files, io
    from .errors import InputError

    if backend is Backend.cuda:
        _resolve_backend(backend)  # no usable GPU: exit 5 before any I/O
    plan, problems = _plan_many(op, many, template)
    backend_name = _resolve_backend(backend) if plan.jobs else backend.value
    if plan.jobs:
        _note_unused_method(backend_name, method)
    no_metadata: set[str] = set()

    def load(job: files.Job) -> Any:
        _refuse_existing(job.targets, force=many.force, skip_existing=many.skip_existing)
        img = io.read_image(job.source)
        channels = 1 if img.ndim == 2 else int(img.shape[2])
        if op == "contour":
            if img.dtype.kind == "f":
                raise InputError(
                    f"contour needs an integer image (uint8 or uint16); {job.source} is float"
                )
            channels = 1
        io.check_format(job.target, dtype=img.dtype, channels=channels, quality=many.quality)
        meta = None
        if many.keep_metadata:
            kind = io.format_for(job.target).name
            if kind in io.METADATA_FORMATS:
                meta = io.read_metadata(job.source)
            elif kind not in no_metadata:
                no_metadata.add(kind)
                _note(
                    f"--keep-metadata: {kind} outputs are written without EXIF or ICC "
                    f"profile (kept for {', '.join(io.METADATA_FORMATS)})"
                )
        return img, meta

    def compute(job: files.Job, loaded: Any) -> Any:
        return _on_device(lambda: apply(loaded[0], backend_name))

    def save(job: files.Job, loaded: Any, result: Any) -> None:
        _make_parent(job.target)
        img = np.asarray(result)
        io.write_image(
            job.target, img, overwrite=many.force, quality=many.quality, metadata=loaded[1]
        )

    _run_many(
        op, plan, problems, jobs=many.jobs, engine=_engine(backend_name, method), load=load,
        compute=compute, save=save,
    )  # fmt: skip


def _make_parent(target: Path) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot write {target}: {e.strerror or e}") from e


@_app_command()
@_command(spinner=True)
def blur(
    images: InPaths,
    k: BoxSideOpt,
    output: OutPath = None,
    border: BorderOpt = Border.reflect101,
    border_value: BorderValueOpt = None,
    backend: BackendOpt = Backend.auto,
    method: MethodOpt = Method.auto,
    out_dir: OutDirOpt = None,
    name: NameOpt = None,
    recursive: RecursiveOpt = False,
    jobs: JobsOpt = None,
    quality: QualityOpt = None,
    keep_metadata: KeepMetadataOpt = False,
    force: ForceOpt = False,
    skip_existing: SkipExistingOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Box blur over K x K pixels: cv2.blur(img, (K, K)).

    Each output pixel is the mean of the K x K window around it.

    Examples:

      imgfilter blur photo.jpg --k 21   (writes photo.blur.jpg)

      imgfilter blur photos/ --recursive --k 5 --out-dir blurred   (many files)
    """
    value = _border_value(border, border_value)

    def apply(img: Any, backend_name: str) -> Any:
        from . import api

        return api.blur(
            img, k, border=border.value, border_value=value, backend=backend_name,
            method=method.value,
        )  # fmt: skip

    many = _Many(
        images, output, out_dir=out_dir, name=name, recursive=recursive, jobs=jobs,
        skip_existing=skip_existing, force=force, quality=quality, keep_metadata=keep_metadata,
    )  # fmt: skip
    _filter_files("blur", many, backend=backend, method=method, apply=apply)


@_app_command("filter")
@_command(spinner=True)
def filter_(
    images: InPaths,
    kernel: KernelOpt,
    normalize: NormalizeOpt = False,
    output: OutPath = None,
    border: BorderOpt = Border.reflect101,
    border_value: BorderValueOpt = None,
    backend: BackendOpt = Backend.auto,
    method: MethodOpt = Method.auto,
    out_dir: OutDirOpt = None,
    name: NameOpt = None,
    recursive: RecursiveOpt = False,
    jobs: JobsOpt = None,
    quality: QualityOpt = None,
    keep_metadata: KeepMetadataOpt = False,
    force: ForceOpt = False,
    skip_existing: SkipExistingOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Correlate with a kernel: cv2.filter2D(img, -1, kernel).

    The kernel is not flipped and its anchor is the centre, as in OpenCV.

    Examples:

      imgfilter filter photo.jpg --kernel "-1,0,1;-2,0,2;-1,0,1"   (Sobel x)

      imgfilter filter photo.jpg --kernel "1 2 1; 2 4 2; 1 2 1" --normalize

      imgfilter filter photo.jpg --kernel sharpen.npy -o sharp.png

      imgfilter filter photos/ --kernel sharpen.npy --out-dir sharp --skip-existing
    """
    value = _border_value(border, border_value)
    k = _kernel(kernel, normalize)

    def apply(img: Any, backend_name: str) -> Any:
        from . import api

        return api.filter2d(
            img, k, border=border.value, border_value=value, backend=backend_name,
            method=method.value,
        )  # fmt: skip

    many = _Many(
        images, output, out_dir=out_dir, name=name, recursive=recursive, jobs=jobs,
        skip_existing=skip_existing, force=force, quality=quality, keep_metadata=keep_metadata,
    )  # fmt: skip
    _filter_files("filter", many, backend=backend, method=method, apply=apply)


@_app_command()
@_command(spinner=True)
def contour(
    images: InPaths,
    output: OutPath = None,
    border: BorderOpt = Border.reflect101,
    border_value: BorderValueOpt = None,
    backend: BackendOpt = Backend.auto,
    method: MethodOpt = Method.auto,
    out_dir: OutDirOpt = None,
    name: NameOpt = None,
    recursive: RecursiveOpt = False,
    jobs: JobsOpt = None,
    quality: QualityOpt = None,
    keep_metadata: KeepMetadataOpt = False,
    force: ForceOpt = False,
    skip_existing: SkipExistingOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Edge map: four 3x3 edge kernels, OR-merged (one channel out).

    The kernels run on the gray image (colour is converted as cv2.cvtColor does);
    the result is bit-exact with four cv2.filter2D calls and cv2.bitwise_or.
    Needs a uint8 or uint16 image.

    Examples:

      imgfilter contour photo.jpg   (writes photo.contour.jpg)

      imgfilter contour 'scans/*.png' --out-dir edges -j 4
    """
    value = _border_value(border, border_value)

    def apply(img: Any, backend_name: str) -> Any:
        from . import api

        return api.contour(
            img, border=border.value, border_value=value, backend=backend_name,
            method=method.value,
        )  # fmt: skip

    many = _Many(
        images, output, out_dir=out_dir, name=name, recursive=recursive, jobs=jobs,
        skip_existing=skip_existing, force=force, quality=quality, keep_metadata=keep_metadata,
    )  # fmt: skip
    _filter_files("contour", many, backend=backend, method=method, apply=apply)


def _kernel(spec: str, normalize: bool) -> Any:
    from .kernelspec import normalize_kernel, parse_kernel

    k = parse_kernel(spec)
    return normalize_kernel(k) if normalize else k


def _tolerance(img: Any, kernel: Any) -> tuple[float, str]:
    """How far imgfilter may stray from OpenCV (docs/design.md, "Agreement with OpenCV")."""
    import numpy as np

    k = np.asarray(kernel, dtype=np.float64)
    if img.dtype.kind == "f":
        scale = float(np.abs(k).sum()) * float(np.abs(img).max(initial=0.0))
        return 1e-5 * max(1.0, scale), "1e-5 * max(1, sum|kernel| * max|img|) for float32 images"
    if np.array_equal(k, np.round(k)):
        return 0.0, "exact: integer kernel on an integer image"
    return 1.0, "1 LSB: non-integer kernel on an integer image"


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - start) * 1e3


@_app_command()
@_command
def compare(
    image: InPath,
    k: Annotated[
        int | None,
        typer.Option(
            "--k",
            "-k",
            min=1,
            max=MAX_BOX_SIDE,
            metavar="K",
            help="Compare the box blur of side K with cv2.blur.",
        ),
    ] = None,
    kernel: Annotated[
        str | None,
        typer.Option(
            "--kernel",
            metavar="SPEC",
            help="Compare filter with this kernel (file or '1,0,-1;...') with cv2.filter2D.",
        ),
    ] = None,
    normalize: NormalizeOpt = False,
    contour_: Annotated[
        bool,
        typer.Option("--contour", metavar="", help="Compare contour with four cv2.filter2D calls."),
    ] = False,
    border: BorderOpt = Border.reflect101,
    border_value: BorderValueOpt = None,
    backend: BackendOpt = Backend.auto,
    method: MethodOpt = Method.auto,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print one JSON object instead of the table.")
    ] = False,
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
    import numpy as np

    chosen = [name for name, on in (("--k", k is not None), ("--kernel", kernel is not None),
                                    ("--contour", contour_)) if on]  # fmt: skip
    if len(chosen) != 1:
        given = " and ".join(chosen) if chosen else "none"
        raise UsageError(f"give exactly one of --k, --kernel or --contour (got {given})")
    if normalize and kernel is None:
        raise UsageError("--normalize applies to --kernel")
    value = _border_value(border, border_value)
    bname = border.value
    if kernel is not None:
        kern = _kernel(kernel, normalize).astype(np.float32)
    elif k is not None:
        kern = np.full((k, k), 1.0 / (k * k), dtype=np.float32)
    else:
        kern = np.array([[1.0]], dtype=np.float32)  # contour: integer kernels

    from . import api, io
    from .backends import opencv

    if backend is Backend.cuda:
        _resolve_backend(backend)  # exit 5 before reading the image
    img = io.read_image(image)
    if contour_ and img.dtype.kind == "f":
        raise UsageError(f"contour needs an integer image (uint8 or uint16); {image} is float")
    backend_name = _resolve_backend(backend)
    opts = dict(border=bname, border_value=value, backend=backend_name, method=method.value)
    if k is not None:
        op, ref_name = f"blur --k {k}", "cv2.blur"
        ours = functools.partial(api.blur, img, k, **opts)
        theirs = functools.partial(opencv.blur, img, k, bname, value)
    elif kernel is not None:
        op = f"filter --kernel {kernel}" + (" --normalize" if normalize else "")
        ref_name = "cv2.filter2D"
        ours = functools.partial(api.filter2d, img, kern, **opts)
        theirs = functools.partial(opencv.filter2d, img, kern, None, bname, value)
    else:
        op, ref_name = "contour", "4 x cv2.filter2D + cv2.bitwise_or"
        ours = functools.partial(api.contour, img, **opts)
        theirs = functools.partial(opencv.contour, img, bname, value)

    ours()  # warm-up: JIT compilation and first-call set-up are not timed
    out, ours_ms = _timed(ours)
    theirs()
    ref, ref_ms = _timed(theirs)

    diff = np.abs(np.asarray(out, dtype=np.float64) - np.asarray(ref, dtype=np.float64))
    max_diff = float(diff.max(initial=0.0))
    mean_diff = float(diff.mean()) if diff.size else 0.0
    mse = float(np.mean(diff * diff)) if diff.size else 0.0
    if img.dtype.kind == "u":
        peak = float(np.iinfo(img.dtype).max)
    else:
        peak = max(1.0, float(np.abs(ref).max(initial=0.0)))
    psnr = math.inf if mse == 0.0 else 10.0 * math.log10(peak * peak / mse)
    tol, rule = _tolerance(img, kern)
    agree = max_diff <= tol
    engine = _engine(backend_name, method)

    if as_json:
        record = {
            "image": str(image),
            "op": op,
            "shape": list(img.shape),
            "dtype": str(img.dtype),
            "border": bname,
            "backend": backend_name,
            "method": method.value,
            "max_abs_diff": max_diff,
            "mean_abs_diff": mean_diff,
            "psnr_db": None if math.isinf(psnr) else psnr,
            "identical": max_diff == 0.0,
            "imgfilter_ms": ours_ms,
            "opencv_ms": ref_ms,
            "opencv_call": ref_name,
            "timing": "wall ms of one call, each after one untimed warm-up call",
            "tolerance": tol,
            "tolerance_rule": rule,
            "agree": agree,
            "verdict": "agree" if agree else "disagree",
        }
        print(json.dumps(record))
    else:
        fmt_diff = (lambda x: f"{x:g}") if img.dtype.kind == "u" else (lambda x: f"{x:.3g}")
        psnr_text = "inf (identical)" if math.isinf(psnr) else f"{psnr:.2f} dB"
        print(f"{op} on {image} ({_describe(img)}), border {bname}")
        print(f"  max abs diff   {fmt_diff(max_diff)}")
        print(f"  mean abs diff  {mean_diff:.4g}")
        print(f"  PSNR           {psnr_text}")
        print(f"  imgfilter      {ours_ms:9.2f} ms  ({engine}, after one warm-up call: no JIT)")
        print(f"  OpenCV         {ref_ms:9.2f} ms  ({ref_name}, after one warm-up call)")
        print(f"  tolerance      {tol:g} ({rule})")
        print(f"  verdict        {'agree' if agree else 'DISAGREE'}")
    if not agree:
        _fail(
            f"imgfilter and OpenCV disagree: max abs diff {max_diff:g} exceeds the tolerance "
            f"{tol:g} ({op}, border {bname}, {engine})"
        )
        raise typer.Exit(1)


@_app_command()
@_command
def bench(
    sizes: Annotated[
        str,
        typer.Option(
            "--sizes",
            metavar="LIST",
            help="Comma-separated image sizes: seed (2167x2495x3), 4k, 8k.",
        ),
    ] = "seed",
    json_path: Annotated[
        Path | None,
        typer.Option("--json", metavar="FILE", help="Also write the results as JSON here."),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option("--quick", metavar="", help="Fewer repeats and a smaller bandwidth probe."),
    ] = False,
    pipeline: Annotated[
        bool,
        typer.Option(
            "--pipeline",
            metavar="",
            help="The pipeline view instead: per-call and kernel time of queued calls on "
            "device arrays (720p, 2167x2495, 4K; filters, softmax, GEMV, a batch of 32 "
            "frames) beside CV-CUDA, PyTorch and CuPy (needs CuPy). --sizes is ignored.",
        ),
    ] = False,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Time imgfilter's CUDA kernels against OpenCV, CuPy and PyTorch (needs a GPU).

    For each operation and size: GPU kernel time (launches queued behind a spin
    kernel, so Numba's launch cost is not counted), per-call time from Python,
    Mpixel/s, GB/s and the ratio to the floor (bytes at the copy bandwidth or FMAs
    at the FMA rate, both measured in the same run). Peers that are not installed
    are skipped with a note.

    Example: imgfilter bench --sizes seed,4k,8k --json results.json
    """
    from . import bench as _bench

    chosen = tuple(s.strip() for s in sizes.split(",") if s.strip())
    unknown = [s for s in chosen if s not in _bench.SHAPES]
    if not chosen or unknown:
        raise UsageError(
            f"unknown size {', '.join(unknown) or repr(sizes)}: choose from "
            f"{', '.join(_bench.SHAPES)}"
        )
    if json_path is not None:
        if json_path.exists() and not force:
            raise OutputError(f"{_shown(json_path)} exists (use --force to overwrite)")
        if not json_path.parent.is_dir():
            raise OutputError(f"output directory {_shown(json_path.parent)} does not exist")
    try:
        _resolve_backend(Backend.cuda)
    except DeviceError as e:
        problem = str(e).replace("--backend cuda: ", "")
        raise DeviceError(f"bench needs an NVIDIA GPU: {problem}") from None
    if pipeline:
        from . import pipeline_bench

        argv = (["--quick"] if quick else []) + (["--json", str(json_path)] if json_path else [])
        rc = pipeline_bench.main(argv)
        if rc:
            raise typer.Exit(rc)
        return
    result = _bench.run(chosen, quick=quick)
    print(_bench.print_table(result))
    if json_path is not None:
        # Atomic, and a temporary file that Ctrl-C removes (io.abandon_io).
        _write_bytes(json_path, json.dumps(result, indent=1).encode(), force=force)
        if not quiet:
            print(f"wrote {_shown(json_path)}")


# ------------------------------------------------------------------------ train / classify

MethodClassify = Enum("MethodClassify", {n: n for n in ("auto", "gemv", "fused")}, type=str)


def _check_npy_output(path: Path, suffix: str, what: str, *, inputs: tuple, force: bool) -> None:
    from . import io

    if path.suffix.lower() != suffix:
        raise OutputError(f"cannot write {path}: {what} must end in {suffix}")
    for inp in inputs:
        io.check_path(path, input_path=inp, overwrite=force)
    if not inputs:
        io.check_path(path, input_path=None, overwrite=force)


def _write_bytes(path: Path, data: bytes, *, force: bool) -> None:
    from . import io

    io.atomic_write(path, data, overwrite=force)


class _Progress:
    """Training progress on stderr: a bar redrawn in place on a terminal, else a line
    every 10 iterations."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total = total
        self.quiet = quiet
        self.tty = sys.stderr.isatty()

    def __call__(self, it: int, loss: float, acc: float) -> None:
        if self.quiet:
            return
        text = f"iteration {it:4d}  loss {loss:.5f}  training accuracy {100 * acc:6.2f}%"
        if self.tty:
            done = int(20 * it / self.total)
            print(f"\r[{'#' * done}{'.' * (20 - done)}] {text}", end="", file=sys.stderr)
        elif it % 10 == 0 or it == 1:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.tty and not self.quiet:
            print(file=sys.stderr)


@_app_command()
@_command
def train(
    image: InPath,
    labels: Annotated[
        Path,
        typer.Argument(
            metavar="LABELS",
            help="Label mask: single-channel image, 0 = unlabelled, 1..C = class numbers.",
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="MODEL.npz",
            help="Model file to write. Default: INPUT_STEM.model.npz beside INPUT.",
        ),
    ] = None,
    features: Annotated[
        str | None,
        typer.Option(
            "--features",
            metavar="SPEC",
            help="Feature set, e.g. 'raw;gauss=1,2,4;box=15;edges=1,2,4;contour' (the default).",
        ),
    ] = None,
    l2: Annotated[
        float,
        typer.Option(
            "--l2",
            min=0.0,
            metavar="LAMBDA",
            help="L2 strength: loss = mean cross-entropy + LAMBDA/2 * |W|^2.",
        ),
    ] = 1e-3,
    max_iter: Annotated[
        int, typer.Option("--max-iter", min=1, metavar="N", help="L-BFGS iterations at most.")
    ] = 300,
    max_samples: Annotated[
        int,
        typer.Option(
            "--max-samples",
            min=2,
            metavar="N",
            help="Labelled pixels used at most (a random subset, see --seed).",
        ),
    ] = 200_000,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed of that subset.")] = 0,
    legend: Annotated[
        Path | None,
        typer.Option(
            "--legend",
            metavar="FILE.json",
            help="LABELS is colour-coded: JSON mapping class numbers to colours, "
            'e.g. {"1": "#ff0000", "2": "#00ff00"}; other colours are unlabelled.',
        ),
    ] = None,
    backend: BackendOpt = Backend.auto,
    quiet: QuietOpt = False,
    force: ForceOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Train a per-pixel classifier from an image and a painted label mask.

    LABELS has the image's size; each pixel holds 0 (unlabelled) or the number of its
    class (1..C), or, with --legend, a colour the legend names. The model (softmax
    regression on filter features: smoothed colour, edges, contours) is written as a
    .npz of plain arrays and JSON metadata.

    Example: imgfilter train photo.jpg scribbles.png -o model.npz
    """
    from . import classify, io

    if backend is Backend.cuda:
        _resolve_backend(backend)
    spec = classify.parse_spec(features) if features is not None else None
    target = output if output is not None else image.with_name(f"{image.stem}.model.npz")
    _check_npy_output(target, ".npz", "a model file", inputs=(image, labels), force=force)
    colours = classify.load_legend(legend) if legend is not None else None
    img = io.read_image(image)
    mask = io.read_image(labels)
    if colours is not None:
        mask = classify.labels_from_colours(mask, colours, name=f"label mask {labels}")
    classify.check_labels(mask, img.shape[:2], name=f"label mask {labels}")
    backend_name = _resolve_backend(backend)
    progress = _Progress(max_iter, quiet)
    start = time.perf_counter()
    try:
        model, info = classify.train(
            img, mask, spec=spec, l2=l2, max_iter=max_iter, max_samples=max_samples,
            seed=seed, backend=backend_name, progress=progress,
        )  # fmt: skip
    finally:
        progress.close()
    seconds = time.perf_counter() - start
    _write_bytes(target, model.to_bytes(), force=force)
    counts = ", ".join(f"class {c}: {n}" for c, n in info.counts.items())
    _info(
        f"wrote {_shown(target)} ({model.n_classes} classes, {model.n_features} features, "
        f"{backend_name}): loss {info.loss:.5f}, training accuracy {100 * info.accuracy:.2f}% "
        f"on {info.samples} pixels ({counts}); {info.iterations} iterations "
        f"({info.stop_reason}), {seconds:.2f} s"
    )


LABELS_TEMPLATE = "{stem}.labels.png"  # each label map's default name


def _labels_beside(image: Path) -> Path:
    """A label map's default output: INPUT_STEM.labels.png beside the input (a lossless
    format whatever the input's: a JPEG would change the labels)."""
    from . import files

    return image.with_name(files.render(LABELS_TEMPLATE, image, "labels"))


LOSSY = (".jpg", ".jpeg")


def _is_template(value: Path | None) -> bool:
    return value is not None and "{" in str(value)


def _lossless_label_map(target: Path) -> None:
    if target.suffix.lower() in LOSSY:
        raise OutputError(f"{target}: a label map needs a lossless format (.png, .tif)")


@_app_command()
@_command(spinner=True)
def classify(
    images: InPaths,
    model: Annotated[
        Path, typer.Option("--model", "-m", metavar="MODEL.npz", help="Model from `train`.")
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="LABELS",
            help="Label map (single channel, class numbers). Default: INPUT_STEM.labels.png. "
            "One input only.",
        ),
    ] = None,
    proba: Annotated[
        Path | None,
        typer.Option(
            "--proba",
            metavar="FILE.npy",
            help="Also write the probabilities, float32 (H, W, C). With several inputs, a "
            "name template such as '{stem}.proba.npy', written beside each label map.",
        ),
    ] = None,
    overlay: Annotated[
        Path | None,
        typer.Option(
            "--overlay",
            metavar="FILE",
            help="Also write the image blended with class colours. With several inputs, a "
            "name template such as '{stem}.overlay.png', written beside each label map.",
        ),
    ] = None,
    temperature: Annotated[
        float,
        typer.Option(
            "--temperature",
            "-t",
            metavar="T",
            help="Divide the logits by T (flatter probabilities for T > 1).",
        ),
    ] = 1.0,
    backend: BackendOpt = Backend.auto,
    method: Annotated[
        MethodClassify,
        typer.Option(
            "--method",
            case_sensitive=False,
            metavar="NAME",
            help="CUDA: gemv (a GEMV per class + softmax kernel; auto) or fused.",
        ),
    ] = MethodClassify.auto,
    out_dir: OutDirOpt = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            metavar="TEMPLATE",
            help="Label map file names, a template of the fields stem, ext, name and op "
            "(labels), each in braces as in Python's str.format (docs/many-files.md). "
            "Default: INPUT_STEM.labels.png.",
        ),
    ] = None,
    recursive: RecursiveOpt = False,
    jobs: JobsOpt = None,
    force: ForceOpt = False,
    skip_existing: SkipExistingOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Label every pixel of an image with a model from `imgfilter train`.

    Writes the label map (each pixel the class number of the training mask), and
    optionally the per-class probabilities (.npy) and a colour overlay.

    Examples:

      imgfilter classify photo.jpg --model model.npz -o labels.png --overlay over.png

      imgfilter classify photos/ -r -m model.npz --out-dir labels --overlay '{stem}.overlay.png'
    """
    from . import classify as _classify
    from . import files

    if backend is Backend.cuda:
        _resolve_backend(backend)
    if not (math.isfinite(temperature) and temperature > 0):
        raise UsageError(f"--temperature must be a positive number, got {temperature}")
    if force and skip_existing:
        raise UsageError("--force and --skip-existing exclude each other")
    template = name if name is not None else LABELS_TEMPLATE
    if name is not None:
        files.check_template(template, "labels", example=LABELS_TEMPLATE)
        if Path(files.render(template, Path("photo.png"), "labels")).suffix.lower() in LOSSY:
            raise UsageError(
                f"--name {template!r}: a label map needs a lossless format (.png, .tif)"
            )
    if output is not None and (out_dir is not None or name is not None):
        raise UsageError("-o names the output itself: give either -o or --out-dir/--name")
    single = _single(images)
    if output is not None and not single:
        raise UsageError(
            "-o names one output file; for several inputs give --out-dir and/or --name"
        )
    extras = []
    for option, value, op in (("--proba", proba, "proba"), ("--overlay", overlay, "overlay")):
        if value is None:
            continue
        example = "{stem}." + op + (".npy" if op == "proba" else ".png")
        if _is_template(value):
            exts = (".npy",) if op == "proba" else None
            files.check_template(str(value), op, option=option, extensions=exts, example=example)
            extras.append(files.Extra(option, str(value), op))
        elif not single:
            raise UsageError(
                f"{option} {value} names one file for several inputs: give a name template "
                f"such as '{example}' (written beside each label map)"
            )
    if out_dir is not None:
        _make_out_dir(out_dir)
    if not single:
        mdl = _classify.load(model)
        _classify_many(
            images, mdl, template, tuple(extras), out_dir=out_dir, recursive=recursive,
            jobs=jobs, force=force, skip_existing=skip_existing, temperature=temperature,
            backend=backend, method=method, proba=proba is not None,
        )  # fmt: skip
        return
    image = images[0]
    if out_dir is not None or name is not None:
        output = files.target_for(
            files.Entry(image), op="labels", out_dir=out_dir, template=template
        )
    label_map = output if output is not None else _labels_beside(image)
    if _is_template(proba):
        proba = files.extra_for(files.Entry(image), label_map, extras[0])
    if _is_template(overlay):
        overlay = files.extra_for(files.Entry(image), label_map, extras[-1])
    if skip_existing:
        outs = [p for p in (label_map, proba, overlay) if p is not None]
        if all(os.path.lexists(p) for p in outs):
            _info(f"{PROG}: {', '.join(map(_shown, outs))} exist(s); skipped (--skip-existing)")
            return
    _classify_file(
        image, model, output, proba=proba, overlay=overlay, temperature=temperature,
        backend=backend, method=method, force=force,
    )  # fmt: skip


def _classify_file(
    image: Path,
    model: Path,
    output: Path | None,
    *,
    proba: Path | None,
    overlay: Path | None,
    temperature: float,
    backend: Backend,
    method: MethodClassify,
    force: bool,
) -> None:
    """One input: check the outputs, read, classify, write, one `wrote` line."""
    import numpy as np

    from . import classify as _classify
    from . import io

    mdl = _classify.load(model)
    target = output if output is not None else _labels_beside(image)
    _lossless_label_map(target)
    target = io.check_output(target, input_path=image, overwrite=force, dtype=np.uint8, channels=1)
    if proba is not None:
        _check_npy_output(proba, ".npy", "--proba", inputs=(image,), force=force)
    if overlay is not None:
        io.check_output(overlay, input_path=image, overwrite=force, dtype=np.uint8, channels=3)
    outs = [p.resolve() for p in (target, proba, overlay) if p is not None]
    if len(set(outs)) != len(outs):
        raise UsageError("the label map, --proba and --overlay must be different files")
    _stage(f"reading {_shown(image)}")
    img = io.read_image(image)
    backend_name = _resolve_backend(backend)
    _stage(f"classifying on {backend_name}")
    start = time.perf_counter()
    pred = _classify.predict(
        img, mdl, temperature=temperature, proba=proba is not None, backend=backend_name,
        method=method.value,
    )  # fmt: skip
    ms = (time.perf_counter() - start) * 1e3
    _stage(f"writing {_shown(target)}")
    io.write_image(target, pred.labels, overwrite=force)
    written = [_shown(target)]
    if proba is not None:
        _write_bytes(proba, _npy_bytes(pred.proba), force=force)
        written.append(_shown(proba))
    if overlay is not None:
        io.write_image(overlay, _classify.overlay(img, pred.labels), overwrite=force)
        written.append(_shown(overlay))
    counts = np.bincount(pred.labels.ravel(), minlength=256)
    share = ", ".join(f"class {c}: {100 * counts[c] / pred.labels.size:.1f}%" for c in mdl.classes)
    engine = f"{backend_name}/{method.value}" if backend_name == "cuda" else backend_name
    _info(
        f"wrote {', '.join(written)} ({_describe(img)}, {engine}, {share}; "
        f"classified in {ms:.1f} ms incl. kernel loading)"
    )


def _npy_bytes(proba: Any) -> bytes:
    import io as _bytes_io

    import numpy as np

    buf = _bytes_io.BytesIO()
    np.save(buf, np.ascontiguousarray(proba, dtype=np.float32))
    return buf.getvalue()


def _classify_many(
    images: list[Path],
    mdl: Any,
    template: str,
    extras: tuple[Any, ...],
    *,
    out_dir: Path | None,
    recursive: bool,
    jobs: int | None,
    force: bool,
    skip_existing: bool,
    temperature: float,
    backend: Backend,
    method: MethodClassify,
    proba: bool,
) -> None:
    """Several inputs: files.run_pipeline with the model loaded once; the label map and
    the --proba/--overlay outputs of each input (extras, in that order)."""
    import numpy as np

    from . import classify as _classify
    from . import files, io
    from .errors import InputError

    many = _Many(images, None, out_dir=out_dir, recursive=recursive, jobs=jobs,
                 skip_existing=skip_existing, force=force)  # fmt: skip
    plan, problems = _plan_many("labels", many, template, extras=extras, what="label map")
    backend_name = _resolve_backend(backend) if plan.jobs else backend.value
    kinds = [x.op for x in extras]

    def load(job: files.Job) -> Any:
        keep = _refuse_existing(job.targets, force=force, skip_existing=skip_existing)
        _lossless_label_map(job.target)
        io.check_format(job.target, dtype=np.uint8, channels=1)
        for kind, path in zip(kinds, job.extras, strict=True):
            if kind == "overlay":
                io.check_format(path, dtype=np.uint8, channels=3)
        return io.read_image(job.source), keep

    def compute(job: files.Job, loaded: Any) -> Any:
        try:
            return _on_device(
                lambda: _classify.predict(
                    loaded[0],
                    mdl,
                    temperature=temperature,
                    proba=proba,
                    backend=backend_name,
                    method=method.value,
                )  # fmt: skip
            )
        except InputError as e:  # e.g. a gray image for a colour model: say which
            raise InputError(f"{_shown(job.source)}: {e.cli_message or e}") from e

    def save(job: files.Job, loaded: Any, pred: Any) -> None:
        img, keep = loaded
        _make_parent(job.target)
        if job.target not in keep:
            io.write_image(job.target, np.asarray(pred.labels), overwrite=force)
        for kind, path in zip(kinds, job.extras, strict=True):
            if path in keep:
                continue
            if kind == "proba":
                _write_bytes(path, _npy_bytes(pred.proba), force=force)
            else:
                labels = np.asarray(pred.labels)
                io.write_image(path, _classify.overlay(img, labels), overwrite=force)

    _run_many(
        "classify", plan, problems, jobs=jobs, engine=_engine(backend_name, method), load=load,
        compute=compute, save=save,
    )  # fmt: skip


def main() -> None:
    """Entry point for `python -m imgfilter`."""
    try:
        app(prog_name=PROG)
    except KeyboardInterrupt:  # before or after a command (parsing, exiting)
        _interrupted_line()
        sys.exit(INTERRUPTED)


if __name__ == "__main__":
    main()
