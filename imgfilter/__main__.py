"""The `imgfilter` command (console script and `python -m imgfilter`).

A GPU command line starts opening the CUDA context in the background before the CLI
and NumPy are imported (`imgfilter.backends.warmup`), and a filtering command starts
reading its input while the CLI imports (`imgfilter.prefetch`); then `imgfilter.cli`
runs, and the process ends without tearing the interpreter down or waiting for the
CUDA context's teardown (`_exit`).
"""

import atexit
import os
import sys
import threading

from .backends import warmup


def main() -> None:
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
