"""Exit without waiting for the CUDA context's teardown (the command line's last step).

A process that holds a CUDA context takes 85-110 ms longer to end on an H100 machine
than one that does not: the kernel driver destroys the context when the process's last
descriptor of a /dev/nvidia* file closes, inside its exit, and the shell or script
waiting for the command waits for that too. That is a third of a later `imgfilter blur`
run on a photo. `hand_off()` gives those descriptors to a small process
(`imgfilter._linger`, C: system calls only) that keeps them until this process has
ended and then exits, so the teardown happens in it, after the command has returned.
The GPU's memory is held for that tenth of a second longer.

Not done (returns None) where it could be seen: on a GPU whose compute mode lets only
one process in at a time (the next command would find the device busy), as process 1
of a container (whose exit ends every other process there anyway), without the
extension (built by `pip install` on Linux where a C compiler is found), and where this
process opened no context through `kernels.common.cudadrv`.
"""

from __future__ import annotations

import os
import sys

try:
    from .. import _linger
except ImportError:
    _linger = None

_ATTR_COMPUTE_MODE = 20  # CU_DEVICE_ATTRIBUTE_COMPUTE_MODE
_COMPUTE_MODE_DEFAULT = 0  # many contexts from many processes
_DEVICE_FILES = "/dev/nvidia"


def device_files() -> tuple[list[int], int]:
    """(descriptors of this process open on /dev/nvidia* files, the highest descriptor
    open), from /proc/self/fd; ([], -1) where that cannot be read."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return [], -1
    nvidia, highest = [], -1
    for name in names:
        fd = int(name)
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        highest = max(highest, fd)
        if target.startswith(_DEVICE_FILES):
            nvidia.append(fd)
    return nvidia, highest


def _shared_device() -> bool:
    """Whether this process opened the driver and the device takes many processes."""
    cudadrv = sys.modules.get("kernels.common.cudadrv")
    drv = getattr(cudadrv, "_driver", None)
    if drv is None:
        return False
    try:
        return drv.attribute(_ATTR_COMPUTE_MODE) == _COMPUTE_MODE_DEFAULT
    except Exception:  # a driver in a failed state: exit the ordinary way
        return False


def hand_off() -> int | None:
    """Give this process's /dev/nvidia* descriptors to a process that keeps them until
    this one has ended; its pid, or None where nothing was handed off (see above).
    Call it last, right before os._exit."""
    if _linger is None or os.getpid() == 1 or not _shared_device():
        return None
    fds, highest = device_files()
    if not fds:
        return None
    try:
        return _linger.hold(fds, highest)
    except OSError:  # no process could be made: exit the ordinary way
        return None
