"""Running a command: in a worker thread (Ctrl-C at once, the spinner), its errors as
one line and an exit code (`run_command`).

Python runs a signal handler only in the main thread, between bytecodes. A command
that filtered in the main thread would sit in OpenCV or a Numba parallel loop (native
code) for the whole of a long filter, and Ctrl-C would wait for it (19 s for an
8000x8000 31x31 filter on 2 cores). Those native calls release the GIL, so the main
thread, waiting for the worker with a timeout, runs the SIGINT handler at once
(`output.end_interrupted`, `in_worker`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from .. import prefetch
from ..errors import DeviceError, ImgFilterError
from .output import PROG, Run, end_interrupted, fail, note

_python_showwarning = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """imgfilter's notes (io.MultiFrameWarning) as one line; other warnings as Python
    shows them."""
    if getattr(category, "cli_note", False):
        note(str(message))
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is a terminal that can draw a spinner or a bar."""
    try:
        return bool(stream.isatty()) and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError, OSError):
        return False


class Spinner:
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
        """Draw (or update) the spinner once the command has run for DELAY seconds."""
        if elapsed < self.DELAY or Run.many:
            return
        with Run.lock:
            if self._progress is None:
                self._start()
            self._progress.update(self._task, description=Run.stage or "working")

    def _start(self) -> None:
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
        self._task = self._progress.add_task(Run.stage or "working", total=None)
        self._progress.start()

    def stop(self) -> None:
        """Erase the spinner (it starts again at the next tick while the work goes on)."""
        if self._progress is not None:
            with contextlib.suppress(Exception):
                self._progress.stop()
            self._progress = None

    def close(self) -> None:
        """Erase the spinner for good and close its descriptor."""
        self.stop()
        with contextlib.suppress(OSError):
            self._file.close()


def in_worker(fn: Callable[..., Any], args: Any, kwargs: Any, *, spinner: bool) -> Any:
    """fn(*args, **kwargs) run in a worker thread while the main thread waits for it;
    its value returned or its exception raised here.

    Ctrl-C meanwhile cannot stop the worker (no thread can be cancelled inside native
    code), so the main thread ends the process without it (`output.end_interrupted`:
    the temporary file of an unfinished write removed, one line, os._exit(130)): a
    normal exit would wait for the worker, or tear down Numba's and OpenCV's thread
    pools under it. The same loop drives the spinner (`spinner` and a terminal).
    Outside the main thread, fn simply runs here (signals do not arrive there).
    """
    if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning
                outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:
            outcome["error"] = e

    worker = threading.Thread(target=work, name=f"{PROG}-command", daemon=True)
    show = Spinner() if spinner and is_terminal(sys.stderr) else None
    Run.spinner = show
    start = time.monotonic()
    try:
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
            if show is not None and worker.is_alive():
                show.tick(time.monotonic() - start)
    except KeyboardInterrupt:  # a process without the SIGINT handler: the same end
        end_interrupted()
    finally:
        Run.spinner = None
        if show is not None:
            show.close()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


class Exit(Exception):  # noqa: N818 - named as typer.Exit and SystemExit are
    """End the command with exit status `code` (its lines already printed)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def run_command(
    call: Callable[[], Any],
    *,
    quiet: bool = False,
    debug: bool = False,
    spinner: bool = False,
    passthrough: tuple[type[BaseException], ...] = (),
) -> Any:
    """call() as a command: in a worker thread (`in_worker`; the spinner when
    `spinner` and not `quiet`), its value returned; an ImgFilterError raised as
    Exit(its exit code) after its one line on stderr, a GPU failure as Exit(5),
    anything else as Exit(1) (with its traceback when `debug`). Exit and the
    exceptions in `passthrough` (Click's, under Typer) go through as they are.
    `quiet` is --quiet: informational lines off."""
    # The input being read in the background (its decoder holding descriptor 2) is
    # read before the command prints anything or a spinner takes descriptor 2.
    prefetch.settle()
    Run.quiet = quiet
    Run.stage = ""
    try:
        return in_worker(call, (), {}, spinner=spinner and not quiet)
    except (Exit, *passthrough):
        raise
    except Exception as e:
        if debug:
            import traceback

            traceback.print_exc()
        raise Exit(report(e, debug)) from None


def report(e: Exception, debug: bool) -> int:
    """The one line for an exception that ended a command; its exit code."""
    if isinstance(e, ImgFilterError):
        fail(e.cli_message or str(e))
        return e.exit_code
    if gpu_failure(e):
        fail(f"the GPU failed: {e}; try --backend cpu")
        return DeviceError.exit_code
    hint = "" if debug else " (run with --debug for the traceback)"
    fail(f"unexpected {type(e).__name__}: {e}{hint}")
    return 1


def gpu_failure(e: BaseException) -> bool:
    """A CUDA error that reached the command (the driver's or Numba's), or a GPU
    allocation that failed: a device problem (exit 5), not an unexpected one."""
    from kernels.common.cudadrv import CudaError

    module = type(e).__module__
    return isinstance(e, CudaError) or module.startswith(("numba.cuda", "cuda."))
