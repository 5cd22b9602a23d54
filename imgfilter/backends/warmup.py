"""Start the GPU early: the CUDA context is created while the CLI is still importing.

Creating the CUDA context takes a quarter of a second on an H100 machine, about as
long as importing NumPy and Typer. The command line calls `start(argv)` first thing;
for a command that will use the GPU, a background thread then loads the driver and
retains the primary context (`kernels.common.cudadrv.driver`, which releases the GIL
meanwhile) while the main thread imports; the CUDA backend's first call finds it open.
The filters (QUICK_COMMANDS) start it where kernels are shipped or cached (they run
without importing Numba); `classify` and `train` (CLASSIFIER_COMMANDS) use the GPU with
or without them.
Commands that will not use it (help, the CPU backend, filters without cached
kernels) start nothing, and neither do `blur` and `contour` with `--backend auto` of an
image that may run on the CPU (`one_image_on_cpu`: its file and the pixels its header
promises at most `cpu_limit(command)` bytes); the CLI calls `start_for` once it knows the
GPU will run (several inputs, or the pixels read). Only the standard library is
imported here.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

QUICK_COMMANDS = ("blur", "filter", "contour", "gaussian", "edges", "sharpen")
CLASSIFIER_COMMANDS = ("classify", "train")
# With --backend auto, a blur or a contour of one image of at most this many bytes (its
# file and its pixels) runs on the CPU (`imgfilter.placement`, the rule for any image
# and filter): OpenCV's box filter goes through memory once (0.7
# ns a byte on two cores) and the contour's gray image and four 3x3 filters about three
# times (a 5-Mpixel photo: 15 and 45 ms, an 8K frame 70 and 220 ms on two cores), so the
# command ends before a CUDA context could be opened (0.2-0.3 s) and used.
DEFERRED_COMMANDS = ("blur", "contour")
ONE_IMAGE_ON_CPU_BYTES = 1 << 27
# The CPU backend's blur runs in bands of rows on every CPU (`backends.cpu`), so a blur
# goes to the CPU up to this much per CPU when that is more: on 16 CPUs (640 MiB) a
# 16000x12000 photo's blur command took 2.2 s on the CPU against 2.5 s on an H200, a
# 12000x8000 one's 1.2 against 1.5 (`benchmarks/blur_one_image.py`).
BLUR_ON_CPU_BYTES_PER_CPU = 40 << 20
# kernels/prebuilt/manifest.json (`kernels.common.shipped`), found without importing `kernels`.
PREBUILT_MANIFEST = Path(__file__).parents[2] / "kernels" / "prebuilt" / "manifest.json"

_thread: threading.Thread | None = None
_result: list = []  # [Driver or None], filled by the thread


def _command(argv: list[str]) -> str | None:
    """The subcommand of an `imgfilter` argument list (the first non-option word)."""
    return next((a for a in argv if not a.startswith("-")), None)


def _option(argv: list[str], name: str) -> str:
    """The value of option `name` (`--name VALUE` or `--name=VALUE`), "auto" if absent."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1].lower()
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1].lower()
    return "auto"


def cpu_limit(command: str) -> int:
    """Bytes of an image (here: of its file, and of its pixels) up to which backend
    auto may filter it on the CPU for `command` (the size limit of
    `imgfilter.placement`'s rule): ONE_IMAGE_ON_CPU_BYTES, or for blur
    BLUR_ON_CPU_BYTES_PER_CPU per CPU this process may run on when that is more (as
    many as OpenCV's threads by default)."""
    if command != "blur":
        return ONE_IMAGE_ON_CPU_BYTES
    return max(ONE_IMAGE_ON_CPU_BYTES, BLUR_ON_CPU_BYTES_PER_CPU * _cpus())


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def one_image_on_cpu(path: str | os.PathLike[str], command: str) -> bool:
    """Whether --backend auto may filter the image in `path` on the CPU with `command`
    (a DEFERRED_COMMANDS one): a regular file of at most `cpu_limit(command)` bytes
    whose header (PNG, JPEG, TIFF; `imgfilter.headers`) promises no more pixels than
    that, or one that cannot be looked at (its read will say why). The CLI checks the
    pixels again once read."""
    from .. import headers

    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return True
    limit = cpu_limit(command)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        return False
    pixels = headers.decoded_bytes(path)
    return pixels is None or pixels <= limit


def _cubins_cached() -> bool:
    """Whether kernels ship with the package or an earlier run cached some."""
    if os.environ.get("IMGFILTER_NO_PREBUILT") != "1" and PREBUILT_MANIFEST.exists():
        return True
    from kernels.common import binaries  # standard library and the manifest reader only

    return binaries.any_cached()


def wanted(argv: list[str]) -> bool:
    """Whether this command line will use the GPU: a filter through cached cubins, or
    classify / train. False for a DEFERRED_COMMANDS one with --backend auto and no
    --method whose input may run on the CPU (`one_image_on_cpu`; an input not known
    from the raw arguments is left to the CLI too)."""
    command = _command(argv)
    if "--help" in argv or "-h" in argv:
        return False
    backend = _option(argv, "--backend")
    if command in DEFERRED_COMMANDS and backend == "auto" and _option(argv, "--method") == "auto":
        from ..prefetch import input_of

        path = input_of(argv)
        if path is None or one_image_on_cpu(path, command):
            return False
    return _wanted(command, backend)


def _wanted(command: str | None, backend: str) -> bool:
    if command not in QUICK_COMMANDS + CLASSIFIER_COMMANDS or backend == "cpu":
        return False
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    if command in CLASSIFIER_COMMANDS:
        return True
    return _cubins_cached()


def _open() -> None:
    from kernels.common.cudadrv import CudaError, driver  # no Numba

    try:
        _result.append(driver())
    except CudaError:
        _result.append(None)


def start(argv: list[str]) -> bool:
    """Begin creating the CUDA context in the background if `argv` will need it."""
    return wanted(argv) and _begin()


def start_for(command: str, backend: str) -> bool:
    """Begin creating the CUDA context in the background for a command whose use of the
    GPU is known only now (a DEFERRED_COMMANDS one), if it will use it."""
    return _thread is None and _wanted(command, backend) and _begin()


def _begin() -> bool:
    global _thread
    if _thread is not None:
        return False
    _thread = threading.Thread(target=_open, name="imgfilter-cuda-init", daemon=True)
    _thread.start()
    return True


def started() -> bool:
    return _thread is not None


def driver():
    """The driver the background thread opened (waiting for it), current on this
    thread; None if it failed. Only after `start` returned True."""
    assert _thread is not None, "warmup.start was not called"
    _thread.join()
    drv = _result[0] if _result else None
    if drv is not None:
        drv.current()
    return drv
