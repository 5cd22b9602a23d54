"""What a command prints on stderr: errors, notes, informational lines.

Every error is one line, `imgfilter: error: <message>` (`fail`); notes and `wrote`
lines go through `info`, which `--quiet` silences. While a spinner or a progress bar
is drawn, lines go above it (`emit`). `Run` holds the state of the command being run.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path
from typing import Any

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
    """`imgfilter: interrupted` on stderr, after whatever stdout holds."""
    prefetch.settle()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    print(f"{PROG}: interrupted", file=sys.stderr, flush=True)


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
