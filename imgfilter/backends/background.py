"""Compiles in a detached process: a kernel specialised for one size, while the call
that needs it runs a size-generic kernel (the same results) in the meantime.

A detached process, not a thread: a Numba compile in a thread holds the GIL for
seconds and slows the caller's every call. The process compiles the kernel by running
it once with compiling allowed; the launch layer keeps its binary in the kernel cache
(`kernels.common.binaries`): the sign, for this and every later process, that the
specialised kernel is ready (`imgfilter.backends.cuda._compiling`). A marker file
beside it says a compile is under way, so concurrent commands start one compile, not
one each; a marker older than STALE_S belongs to a compile that died.
IMGFILTER_BACKGROUND_COMPILE=0 turns all this off: callers then compile at once.
Nothing here imports Numba.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

from kernels.common import binaries

ENABLED = os.environ.get("IMGFILTER_BACKGROUND_COMPILE") != "0"
STALE_S = 300.0


def start(name: str, code: str) -> bool:
    """Run the Python source `code` in a detached process that compiles kernel `name`,
    unless a live one is at it already. False when background compiles are off or
    there is no cache directory to write into (nothing a compile could leave)."""
    if not ENABLED:
        return False
    marker = binaries.pending_marker(name)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:  # created atomically: of threads or processes asking at once, one starts it
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if time.time() - marker.stat().st_mtime < STALE_S:
                return True
            marker.write_text(str(os.getpid()))  # a stale marker: taken over
        else:
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
    except OSError:
        return False
    try:
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)  # fmt: skip
    except OSError:
        return False
    return True


@contextlib.contextmanager
def compiling(name: str) -> Iterator[None]:
    """The body of a background compile of kernel `name`: a failure is swallowed (the
    generic kernel still runs; IMGFILTER_DEBUG_CUBINS=1 reports it) and the marker is
    removed at the end, whatever happened."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - an optimisation: the generic kernel still runs
        if os.environ.get("IMGFILTER_DEBUG_CUBINS") == "1":
            print(f"imgfilter: background compile of {name} failed: {exc!r}", file=sys.stderr)
    finally:
        try:
            binaries.pending_marker(name).unlink()
        except OSError:
            pass
