"""What native codecs and unfinished writes hold, and letting go of it at once.

Quieting. OpenCV logs warnings a user does not need, and libpng and libjpeg write straight
to the C stderr, past any log level. `quiet_native` points file descriptor 2 at a
temporary file while a codec runs, so that a user sees only imgfilter's one-line error,
and `cv_call` turns a failed OpenCV call into the line that says why.

Leaving at once. An unfinished read or write holds temporary files not yet renamed onto
their target (`create_temp`) and the saved descriptor of the real stderr. A process that
must stop at once (the CLI on Ctrl-C) calls `abandon_io()` first: it removes those files
and gives descriptor 2 back to stderr.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .headers import host_pixel_limit

# What an unfinished read or write holds: temporary files not yet renamed onto their
# target, and the duplicates of file descriptor 2 saved while a decoder's chatter is
# captured. `abandon_io` (another thread, the process about to os._exit) undoes both.
_held_lock = threading.Lock()
_temp_files: set[Path] = set()
_saved_stderr_fds: list[int] = []
_abandoned = False


def abandon_io() -> None:
    """Remove the temporary files of unfinished writes and point file descriptor 2 back
    at the real stderr; writes started afterwards fail. For a process that is about to
    end with os._exit while another thread may still be reading or writing an image.
    """
    global _abandoned
    with _held_lock:
        _abandoned = True
        for tmp in list(_temp_files):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        _temp_files.clear()
        if _saved_stderr_fds:
            with contextlib.suppress(OSError):
                os.dup2(_saved_stderr_fds[0], 2)


# ---------------------------------------------------------------------------------------
# Quieting native decoders


# "[ERROR:0@0.411] global grfmt_tiff.cpp:117 TIFF_Error " and
# "OpenCV(4.8.0) /io/.../bitstrm.cpp:102: error: (-2:Unspecified error) " carry no news.
_LOG_PREFIX = re.compile(r"^\[\s*[A-Z]+:\d+(?:@[\d.]+)?\]\s+(?:global\s+)?\S+:\d+\s+\S+\s+")
_CV_ERROR_PREFIX = re.compile(r"OpenCV\([^)]*\)\s+\S+:\d+:\s+error:\s+\([^)]*\)\s*")


class _Captured:
    """Text the native libraries wrote to stderr inside `quiet_native()`."""

    text = ""

    def last_line(self) -> str:
        """The last error line (else the last line), without OpenCV's log decoration."""
        lines = [line.strip() for line in self.text.splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()]
        line = (errors or lines or [""])[-1]
        line = _CV_ERROR_PREFIX.sub("", _LOG_PREFIX.sub("", line))
        return line if len(line) <= 200 else line[:197] + "..."


# One capture is shared by the threads that decode or encode at the same time (the
# many-files pipeline, imgfilter.files): file descriptor 2 and OpenCV's log level are
# process-wide, so the first thread in redirects them and the last one out restores them.
# The file that descriptor 2 points at meanwhile is made once and kept, emptied each time
# the last thread leaves: a new temporary file for every image cost a call about 90 us
# (CPU, most of it holding the GIL and the lock that every codec thread takes).
_capture_depth = 0
_capture_sink: Any = None  # the kept temporary file (None until the first capture)
_capture_pid = 0  # the process that made it (a forked child makes its own)
_capture_level: tuple[Any, Any] | None = None  # (OpenCV's logging module, its old level)


@contextlib.contextmanager
def quiet_native(cv2: Any) -> Iterator[_Captured]:
    """Quiet OpenCV's log and capture what native code prints on file descriptor 2.

    OpenCV's log is lowered to errors only (its warnings are noise to a user), and
    libpng and libjpeg write straight to the C stderr past that log level, so file
    descriptor 2 points at a temporary file for the duration. What landed there is
    available afterwards as `.text` and `.last_line()` (to explain a failed decode).
    Anything another thread writes to stderr meanwhile is captured too. Threads inside
    at the same time share one capture (the first in redirects, the last out
    restores), so each sees what was written from its start to its end, its
    neighbours' chatter included.
    """
    captured = _Captured()
    start = _begin_capture(cv2)
    if start is None:  # no stderr at all: nothing to silence
        yield captured
        return
    try:
        yield captured
    finally:
        captured.text = _end_capture(start)


def _begin_capture(cv2: Any) -> int | None:
    """Join (or start) the shared capture; the sink's offset where this one starts."""
    global _capture_depth, _capture_sink, _capture_pid, _capture_level
    with _held_lock:
        if _capture_depth == 0:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            try:
                saved_fd = os.dup(2)
            except OSError:
                return None
            if _capture_sink is None or _capture_pid != os.getpid():
                _capture_sink, _capture_pid = tempfile.TemporaryFile(), os.getpid()
            _saved_stderr_fds.append(saved_fd)
            if not _abandoned:
                os.dup2(_capture_sink.fileno(), 2)
            logging = getattr(getattr(cv2, "utils", None), "logging", None)
            if logging is None or not hasattr(logging, "setLogLevel"):
                logging = cv2 if hasattr(cv2, "setLogLevel") else None  # OpenCV 4.8
            _capture_level = None
            if logging is not None:
                old_level = logging.getLogLevel()
                logging.setLogLevel(min(old_level, 2))  # LOG_LEVEL_ERROR; errors get captured
                _capture_level = (logging, old_level)
        _capture_depth += 1
        return os.lseek(_capture_sink.fileno(), 0, os.SEEK_END)


def _end_capture(start: int) -> str:
    """Leave the shared capture; what was written to it since `start`."""
    global _capture_depth, _capture_level
    with _held_lock:
        fd = _capture_sink.fileno()
        end = os.lseek(fd, 0, os.SEEK_END)
        data = b""
        if end > start:
            if hasattr(os, "pread"):
                data = os.pread(fd, end - start, start)
            else:  # pragma: no cover - Windows; nothing else writes while it is captured
                os.lseek(fd, start, os.SEEK_SET)
                data = os.read(fd, end - start)
                os.lseek(fd, 0, os.SEEK_END)
        _capture_depth -= 1
        if _capture_depth == 0:
            saved_fd = _saved_stderr_fds.pop()
            if not _abandoned:
                os.dup2(saved_fd, 2)
            os.close(saved_fd)
            if end:  # emptied for the next capture (nothing writes to it now)
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
                    os.lseek(fd, 0, os.SEEK_SET)
            if _capture_level is not None:
                logging, old_level = _capture_level
                logging.setLogLevel(old_level)
                _capture_level = None
    return data.decode("utf-8", "replace")


_CV2_BEFORE: list[bool] = []  # [whether cv2 was loaded before import_cv2 first ran]


def import_cv2() -> Any:
    """cv2, imported when first needed (importing this module stays cheap). OpenCV
    reads its decode limit (OPENCV_IO_MAX_IMAGE_PIXELS, default 2**30 pixels) once, as
    it loads: the first call sets it, unless the user did, to `host_pixel_limit`
    before cv2 loads."""
    if not _CV2_BEFORE:
        _CV2_BEFORE.append("cv2" in sys.modules)
        if not _CV2_BEFORE[0]:
            os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(host_pixel_limit()))
    import cv2

    return cv2


def cv2_loaded_first() -> bool:
    """Whether cv2 had been loaded before imgfilter could raise its decode limit."""
    return bool(_CV2_BEFORE and _CV2_BEFORE[0])


def cv_call(cv2: Any, call: Callable[[], Any]) -> tuple[Any, str]:
    """(call()'s result, "") with OpenCV's chatter captured, or (None, the line that
    says why: the cv2.error's last line, else the last line OpenCV printed)."""
    detail = ""
    with quiet_native(cv2) as noise:
        try:
            return call(), ""
        except cv2.error as e:
            detail = str(e).strip().splitlines()[-1] if str(e).strip() else ""
    return None, detail or noise.last_line()


def create_temp(directory: Path, name: str) -> tuple[int, Path]:
    """A new file beside the target; created 0o666 & ~umask like any new file.

    It is listed in `_temp_files` (for `abandon_io`) until `forget_temp`; after
    `abandon_io` no temporary file is created.
    """
    # Read and write: a .npy written through a memory map (`write_npy_from`) needs both.
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = directory / f".{name}.{os.urandom(4).hex()}.tmp"
        with _held_lock:
            if _abandoned:
                raise OSError(errno.ECANCELED, "interrupted")
            try:
                fd = os.open(tmp, flags, 0o666)
            except FileExistsError:
                continue
            _temp_files.add(tmp)
            return fd, tmp


def forget_temp(tmp: Path) -> None:
    """`tmp` was renamed onto its target or removed: no longer `abandon_io`'s to remove."""
    with _held_lock:
        _temp_files.discard(tmp)
