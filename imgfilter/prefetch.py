"""Read a filtering command's input while the command line is still importing.

After NumPy and OpenCV, the `imgfilter` command spends 40-70 ms importing Typer and its
own modules and parsing the options before it reads its input, and reading a photo
takes about as long; both are on the path of every run. `start(argv)` (called by
`imgfilter.__main__` before the CLI is imported) reads the input in a background thread
meanwhile (the decoders release the GIL) and registers `take` with `imgfilter.io`
(`io.set_pre_reader`): `io.read_image` then takes that image when it is asked for the
same file, unchanged since. (This module imports io, never the other way round.)

Only a guess from the raw arguments, checked later: the word right after `blur`,
`filter` or `contour` (as in `imgfilter blur photo.jpg --k 21`), when it names a regular
file of at most MAX_BYTES and `--help` is not asked. Whatever goes wrong in the
background (a damaged file, a changed one) is dropped and the command reads the file
itself, so errors and notes are the ones it gives anyway. The reader points descriptor
2 at a temporary file while a decoder runs (`io_native.quiet_native`), so nothing may write
to stderr meanwhile: the CLI waits for it (`settle`) before its first line.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path
from typing import Any

COMMANDS = ("blur", "filter", "contour", "gaussian", "edges", "sharpen")
# Python's GIL switch interval while the read runs. The reader gives up the GIL at every
# system call and decoder; with the default 5 ms it then waits up to that long each time
# for the importing main thread to hand it back, which doubled a photo's read.
SWITCH_INTERVAL_S = 0.0002
MAX_BYTES = 64 << 20  # larger files are read by the command, not held twice in memory


class _Read:
    """One background read. (A plain class: this module is imported before the read
    starts, and `dataclasses` would cost the read's start a few milliseconds.)"""

    __slots__ = ("path", "signature", "result", "done")

    def __init__(self, path: str, signature: tuple[int, ...]) -> None:
        self.path = path  # absolute
        self.signature = signature
        self.result: Any = None  # io_read.read_frames's (image, frames, kind); None if it failed
        self.done = threading.Event()


_lock = threading.Lock()
_pending: list[_Read] = []  # at most one: the read not taken yet


def _signature(path: str) -> tuple[int, ...] | None:
    """(device, inode, size, mtime ns) of a regular file, None for anything else."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def input_of(argv: list[str]) -> str | None:
    """The file a filtering command line reads first, as guessed above; None when
    there is no such guess."""
    if "--help" in argv or "-h" in argv:
        return None
    at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if at is None or argv[at] not in COMMANDS or at + 1 >= len(argv):
        return None
    word = argv[at + 1]
    return None if word.startswith("-") else word


def start(argv: list[str]) -> bool:
    """Begin reading the input of `argv` in a background thread (see the module's
    docstring); False where nothing was started."""
    path = input_of(argv)
    signature = _signature(path) if path is not None else None
    if signature is None or signature[2] > MAX_BYTES:
        return False
    # NumPy and OpenCV, which the command needs anyway: imported here, before the
    # thread starts, the read begins with the decode instead of competing with the CLI's
    # imports for the GIL.
    from . import io, io_read
    from .io_native import import_cv2

    import_cv2()

    read = _Read(os.path.abspath(path), signature)
    with _lock:
        if _pending:
            return False
        _pending.append(read)
    io.set_pre_reader(take)
    threading.Thread(target=_read, args=(read, io_read), name="imgfilter-prefetch",
                     daemon=True).start()  # fmt: skip
    return True


def _read(read: _Read, io_read: Any) -> None:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL_S))
    try:
        read.result = io_read.read_frames(Path(read.path))
    except Exception:  # noqa: BLE001 - the command reads it again and reports
        read.result = None
    finally:
        sys.setswitchinterval(interval)
        read.done.set()


def take(path: str | os.PathLike[str]) -> tuple[Any, int, str | None] | None:
    """What the background read gave for `path` (waiting for it), if it read that file
    and the file is unchanged since; else None (read it). Given once."""
    with _lock:
        if not _pending or _pending[0].path != os.path.abspath(path):
            return None
        read = _pending.pop()
    read.done.wait()
    if read.result is None or _signature(read.path) != read.signature:
        return None
    return read.result


def settle() -> None:
    """Wait for a background read still running (so stderr is the terminal again)."""
    with _lock:
        read = _pending[0] if _pending else None
    if read is not None:
        read.done.wait()
