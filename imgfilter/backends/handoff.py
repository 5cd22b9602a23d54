"""Exit without waiting for the CUDA context's teardown (the command line's last step).

A process that holds a CUDA context takes 85-110 ms longer to end on an H100 machine
than one that does not: the kernel driver destroys the context when the last
descriptor of its /dev/nvidia* files closes, inside the process's exit, and the shell or
script waiting for the command waits for that too. That is a third of a later
`imgfilter blur` run on a photo. `hand_off()` starts a small process (`os.posix_spawn`
of this Python, which neither forks this multi-threaded process nor runs the CUDA
driver's fork handlers) that inherits those descriptors and no other, and waits for
end-of-file on a pipe whose only writer is this process: it ends right after this one,
and the teardown happens in it, after the command has returned. The GPU's memory is
held for that tenth of a second longer.

Not done (returns None) where it could be seen: on a GPU whose compute mode lets only
one process in at a time (the next command would find the device busy), as process 1
of a container (whose exit ends every other process there anyway), off Linux, and where
this process opened no context through `kernels.common.cudadrv`.
"""

from __future__ import annotations

import os
import sys

_ATTR_COMPUTE_MODE = 20  # CU_DEVICE_ATTRIBUTE_COMPUTE_MODE
_COMPUTE_MODE_DEFAULT = 0  # many contexts from many processes
_DEVICE_FILES = "/dev/nvidia"
# The lingering process: reads its standard input until end-of-file, then exits.
_LINGER = "import os\nwhile os.read(0, 4096):\n    pass\n"


def open_files() -> tuple[list[int], list[int]]:
    """(descriptors of this process open on /dev/nvidia* files, its other descriptors),
    from /proc/self/fd; ([], []) where that cannot be read."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return [], []
    nvidia, others = [], []
    for name in names:
        fd = int(name)
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        (nvidia if target.startswith(_DEVICE_FILES) else others).append(fd)
    return nvidia, others


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


def hold(fds: list[int], others: list[int]) -> int:
    """Start a process that keeps the open descriptors `fds` until this process has
    ended, then exits; its pid. `others` (this process's other descriptors) are not
    passed on: a pipe to whoever reads this command's output would stay open with
    them. OSError where no process could be started."""
    read_end, write_end = os.pipe()  # not inheritable: only read_end is given, as stdin
    try:
        for fd in fds:
            os.set_inheritable(fd, True)  # kept across the new program's start
        actions = [(os.POSIX_SPAWN_DUP2, read_end, 0)]
        actions += [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (1, 2)]
        keep = {0, 1, 2, *fds}
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in others if fd not in keep]
        argv = [sys.executable, "-I", "-S", "-c", _LINGER]
        return os.posix_spawn(sys.executable, argv, {}, file_actions=actions)
    finally:
        # write_end stays open until this process exits: then the lingerer reads
        # end-of-file. (Not inheritable: no program this one may still start keeps it.)
        os.close(read_end)


def hand_off() -> int | None:
    """Give this process's /dev/nvidia* descriptors to a process that keeps them until
    this one has ended (`hold`); its pid, or None where nothing was handed off (see
    above). Call it last, right before os._exit."""
    if not hasattr(os, "posix_spawn") or os.getpid() == 1 or not _shared_device():
        return None
    fds, others = open_files()
    if not fds:
        return None
    try:
        return hold(fds, others)
    except OSError:  # no process could be started: exit the ordinary way
        return None
