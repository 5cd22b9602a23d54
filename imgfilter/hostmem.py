"""Host memory for large results: huge pages, and the memory of dropped results reused.

The first write to fresh memory faults its pages in, and the kernel zeroes each one:
for a 4.8 GB result, 0.6 s over 16 threads in 4 KiB pages on an H100 host, 0.2 s in
2 MiB ones, as long as the filter's own copies. So `host_empty` gives a result of
HUGE_PAGE_BYTES or more its own private mapping advised for transparent huge pages
(Linux `madvise`), and when the last array over that memory is gone the mapping is
kept for the next result of the same size, whose writes then fault nothing. A kept
mapping is advised MADV_FREE: the kernel may take its pages back under memory
pressure (a reuse then faults in zeroed pages again, as fresh memory would), else
they stay. At most KEEP_RESULTS mappings and 1/KEEP_FRACTION of physical memory are
kept; `release_results()` unmaps them at once. Elsewhere (no madvise), np.empty.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref

import numpy as np

HUGE_PAGE_BYTES = 32 << 20  # results this large get their own mapping
KEEP_RESULTS = 2  # dropped results' mappings kept at most
KEEP_FRACTION = 4  # ... taking at most 1/KEEP_FRACTION of physical memory
_PAGE = 2 << 20  # mappings in whole huge pages, so that same-size results match

_lock = threading.Lock()
_kept: list[mmap.mmap] = []  # oldest first; no array uses them
_freed: list[mmap.mmap] = []  # appended by finalizers, moved to _kept under _lock


def host_empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised C-contiguous host array of `shape` and `dtype`: for
    HUGE_PAGE_BYTES or more, in a kept mapping of the same size when there is one
    (it holds an earlier result's values), else a new one on transparent huge pages;
    otherwise (or where mmap or madvise cannot) np.empty."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if nbytes < HUGE_PAGE_BYTES or advice is None:
        return np.empty(shape, dt)
    size = -(-nbytes // _PAGE) * _PAGE
    region = _take(size)
    if region is None:
        try:
            region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            region.madvise(advice)
        except (OSError, ValueError):
            return np.empty(shape, dt)
    # The arrays hold `holder` (a byte array over the mapping, their base), so it
    # lives as long as any array or view over this memory; when it goes, the
    # mapping may serve again.
    holder = np.frombuffer(region, np.uint8)
    flat = holder[:nbytes].view(dt)
    weakref.finalize(holder, _keep, region).atexit = False
    return flat.reshape(shape)


def release_results() -> int:
    """Unmap the kept mappings of dropped results; returns the bytes released."""
    with _lock:
        _collect()
        gone, _kept[:] = list(_kept), []
    released = sum(len(region) for region in gone)
    for region in gone:
        _close(region)
    return released


def kept_bytes() -> int:
    """Bytes of the mappings kept for later results."""
    with _lock:
        _collect()
        return sum(len(region) for region in _kept)


def _keep(region: mmap.mmap) -> None:
    """Finalizer: the last array over `region` is gone (may run in any thread, at
    any allocation: only appends, and trims when the lock is free)."""
    advice = getattr(mmap, "MADV_FREE", None)
    if advice is not None:
        with contextlib.suppress(OSError, ValueError):
            region.madvise(advice)
    _freed.append(region)
    if _lock.acquire(blocking=False):
        try:
            _collect()
        finally:
            _lock.release()


def _take(size: int) -> mmap.mmap | None:
    """A kept mapping of exactly `size` bytes, no longer kept; None if none."""
    with _lock:
        _collect()
        for i, region in enumerate(_kept):
            if len(region) == size:
                return _kept.pop(i)
    return None


def _collect() -> None:
    """Move finalized mappings to _kept, then unmap the oldest past the limits
    (with _lock held)."""
    while _freed:
        _kept.append(_freed.pop(0))
    limit = _physical_bytes() // KEEP_FRACTION
    while _kept and (len(_kept) > KEEP_RESULTS or sum(map(len, _kept)) > limit):
        _close(_kept.pop(0))


def _close(region: mmap.mmap) -> None:
    with contextlib.suppress(BufferError, OSError):
        region.close()


def _physical_bytes() -> int:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return 16 << 30
