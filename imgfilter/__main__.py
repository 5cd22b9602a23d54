"""The `imgfilter` command (console script and `python -m imgfilter`).

Ctrl-C is handled first (`_handle_ctrl_c`). A GPU command line then starts opening the
CUDA context in the background before the CLI and NumPy are imported
(`imgfilter.backends.warmup`), and a filtering command starts reading its input while
the CLI imports (`imgfilter.prefetch`); then `imgfilter.cli` runs, and the process ends
without tearing the interpreter down or waiting for the CUDA context's teardown
(`_exit`).
"""

import atexit
import os
import signal
import sys
import threading


def main() -> None:
    """Run the `imgfilter` command line of sys.argv; ends the process."""
    _handle_ctrl_c()
    from .backends import warmup

    warmup.start(sys.argv[1:])
    from . import prefetch

    prefetch.start(sys.argv[1:])
    from .cli import main as cli_main

    try:
        cli_main()
    except SystemExit as done:
        _exit(done.code)
        raise
    _exit(0)


def _handle_ctrl_c() -> None:
    """From here on, SIGINT ends the process with one line and exit 130 whatever it is
    doing (`_interrupted`), instead of a KeyboardInterrupt that would unwind an import
    or a library with a traceback. A SIGINT that the parent left ignored (a script's
    background job) stays ignored. Before this runs (Python's own start, about 20-60
    ms), Ctrl-C ends the process as it ends any Python program."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _interrupted)
    from .cli import output  # noqa: F401 - what `_interrupted` ends with, from now on


def _interrupted(signum, frame) -> None:
    """The SIGINT handler: `cli.output.end_interrupted` (spinner erased, temporary
    files removed, one line, os._exit(130)) once that module is imported, which
    `_handle_ctrl_c` does before anything is read, written or drawn; until then, the
    line and the exit alone."""
    output = sys.modules.get(__package__ + ".cli.output")
    end = getattr(output, "end_interrupted", None)
    if end is not None:
        end()
    os.write(2, b"imgfilter: interrupted\n")
    os._exit(130)


def _exit(status) -> None:
    """End the process with `status` (a SystemExit code) as sys.exit would, minus the
    interpreter's teardown: atexit handlers run and the standard streams are flushed,
    then os._exit skips freeing every module and the libraries' own exit handlers, and
    the CUDA context is torn down by another process after this one has ended
    (`backends.handoff`: a tenth of a second after a GPU command, longer than the
    command's own work on a photo). Outputs are complete files by then (written
    atomically). Returns, leaving the normal exit to run, while
    any other non-daemon thread is alive (a thread pool not shut down, a Dask client):
    a normal exit waits for those."""
    others = [t for t in threading.enumerate() if t is not threading.current_thread()]
    if any(not t.daemon for t in others) or not hasattr(atexit, "_run_exitfuncs"):
        return
    if status is None:
        code = 0
    elif isinstance(status, int):
        code = status
    else:
        print(status, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach it
            pass
    if "kernels.common.cudadrv" in sys.modules:
        from .backends import handoff

        handoff.hand_off()
    os._exit(code)


if __name__ == "__main__":
    main()
