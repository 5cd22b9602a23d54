"""What a command prints on stderr: errors, notes, informational lines.

Every error is one line, `imgfilter: error: <message>` (`fail`); notes and `wrote`
lines go through `info`, which `--quiet` silences. While a spinner or a progress bar
is drawn, lines go above it (`emit`). `Run` holds the state of the command being run.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from .. import prefetch

PROG = "imgfilter"
INTERRUPTED = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C


class Run:
    """The command being run: --quiet, and what it is doing (for the spinner)."""

    quiet = False
    stage = ""
    lock = threading.RLock()
    spinner: Any = None  # worker.Spinner while one may be drawn
    bar: Any = None  # many files: many.Bar, the progress bar (no spinner then)
    many = False  # many files are being filtered: the spinner stays off
    err: Any = None  # where lines go instead of sys.stderr (many files: see many.run_many)


def one_line(message: str) -> str:
    """Collapse a message onto one line (some library messages span several)."""
    parts = [line.strip() for line in str(message).splitlines() if line.strip()]
    return "; ".join(parts) or "(no message)"


def fail(message: str) -> None:
    """An error line on stderr, `imgfilter: error: <message>` (never silenced)."""
    prefetch.settle()  # stderr is the terminal again
    print(f"{PROG}: error: {one_line(message)}", file=sys.stderr)


def info(line: str) -> None:
    """An informational line on stderr (not an error): dropped with --quiet."""
    if Run.quiet:
        return
    emit(line)


def emit(line: str) -> None:
    """A line on stderr, above the spinner or the progress bar."""
    with Run.lock:
        if Run.bar is not None:
            Run.bar.print(line)
            return
        if Run.spinner is not None:
            Run.spinner.stop()  # the line goes above; the spinner comes back next tick
        stream = Run.err if Run.err is not None else sys.stderr
        print(line, file=stream, flush=True)


def note(message: str) -> None:
    """A note, `imgfilter: <message>` on one line: dropped with --quiet."""
    info(f"{PROG}: {one_line(message)}")


def stage(text: str) -> None:
    """What the command does now, shown by the spinner."""
    Run.stage = text


def interrupted_line() -> None:
    """`imgfilter: interrupted` on stderr, after whatever stdout holds (a Ctrl-C that
    reached a command run in this thread as KeyboardInterrupt; see `end_interrupted`)."""
    prefetch.settle()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    print(f"{PROG}: interrupted", file=sys.stderr, flush=True)


def end_interrupted(signum: int | None = None, frame: Any = None) -> NoReturn:
    """Ctrl-C: end the process now with the line `imgfilter: interrupted` and exit 130.

    The `imgfilter` process's SIGINT handler (`imgfilter.__main__`): Python runs it in
    the main thread at its next bytecode, wherever that thread is (importing, parsing,
    waiting for the command's worker thread), so no KeyboardInterrupt ever unwinds an
    import or a library. Nothing is waited for, neither the worker (inside OpenCV or
    Numba) nor a background read (a 28 MB PNG decodes for a second): the spinner or the
    progress bar is erased, the temporary files of unfinished writes are removed and
    descriptor 2 points at stderr again (`io.abandon_io`; outputs are renamed into
    place only when complete, so none is partial), stdout is flushed, and os._exit
    skips the interpreter's teardown, which would wait for those threads. The line
    goes to descriptor 2 itself: the main thread may have been inside a write to
    sys.stderr."""
    for drawn in (Run.spinner, Run.bar):
        if drawn is not None:
            with contextlib.suppress(Exception):
                drawn.stop()
    io = sys.modules.get(__name__.partition(".")[0] + ".io")  # imported if it read or wrote
    abandon = getattr(io, "abandon_io", None)
    if abandon is not None:
        with contextlib.suppress(Exception):
            abandon()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(OSError):
        os.write(2, f"{PROG}: interrupted\n".encode())
    os._exit(INTERRUPTED)


def shown(path: Path) -> str:
    """A path as messages show it: relative to the working directory when below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def describe(img: Any) -> str:
    """`WxH px, C ch DTYPE` of an image array."""
    h, w = img.shape[:2]
    c = 1 if img.ndim == 2 else img.shape[2]
    return f"{w}x{h} px, {c} ch {img.dtype}"
