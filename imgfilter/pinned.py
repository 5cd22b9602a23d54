"""Page-locked (pinned) host buffers, kept between calls.

Copies between the GPU and page-locked memory run at the bus's speed and can overlap
other work; copies to or from ordinary (pageable) memory go through the driver's own
staging buffers, several times slower. Page-locking costs about as much as copying
the memory several times over (an H100 host: 0.65 s for 1 GiB), so buffers are kept
once made and handed out again: `take` gives the smallest free one large enough (or
makes one), `keep` hands it back, `release` frees the free ones. At most LIMIT bytes
are kept page-locked at once; past that `take` says no and the caller uses
ordinary memory.

Used by the row bands of `imgfilter.streamed`.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from kernels.common.cudadrv import address as address_of
from kernels.common.cudadrv import host_bytes

LIMIT = 1 << 30  # page-locked bytes kept at most

_LOCK = threading.Lock()
_SIZES: dict[int, int] = {}  # address -> bytes, every buffer made
_FREE: list[int] = []  # addresses of the buffers not in use
_MAKING = [0]  # bytes of new buffers being made now (counted against LIMIT)


def take(shape: tuple, dtype, drv: Any) -> tuple[np.ndarray, int] | None:
    """(array, address): a page-locked array of `shape` and `dtype` at `address`,
    a kept buffer when one is large enough, else a new one; None when a new one
    would take the kept bytes past LIMIT. `drv` is the CUDA driver
    (`kernels.common.cudadrv.driver()`); None (Numba's simulator) gives plain NumPy."""
    if drv is None:
        arr = np.empty(shape, dtype)
        return arr, address_of(arr)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    with _LOCK:
        fits = [a for a in _FREE if _SIZES[a] >= nbytes]
        address = min(fits, key=_SIZES.__getitem__) if fits else None
        if address is not None:
            _FREE.remove(address)
        elif sum(_SIZES.values()) + _MAKING[0] + nbytes > LIMIT:
            return None
        else:
            _MAKING[0] += nbytes  # page-locking is slow: made outside the lock
    if address is None:
        try:
            address = drv.host_alloc(nbytes)
            with _LOCK:
                _SIZES[address] = nbytes
        finally:
            with _LOCK:
                _MAKING[0] -= nbytes
    size = _SIZES[address]
    buffer = host_bytes(address, size)
    return buffer[:nbytes].view(dtype).reshape(shape), address


def keep(address: int) -> None:
    """Hand a buffer from `take` back (its arrays must no longer be used)."""
    with _LOCK:
        if address in _SIZES and address not in _FREE:
            _FREE.append(address)


def release() -> int:
    """Free the kept buffers not in use; returns the bytes freed."""
    from kernels.common.cudadrv import driver

    with _LOCK:
        freed = [(a, _SIZES.pop(a)) for a in _FREE]
        _FREE.clear()
    drv = driver() if freed else None
    for at, _ in freed:
        drv.host_free(at)
    return sum(n for _, n in freed)
