"""Host images larger than the GPU's memory (or a budget), filtered in row bands.

A band of output rows needs the input rows it covers plus the filter's reach above
and below (`reach`: rows of halo). Each band is copied to the GPU, filtered there as
if it were a whole image, and its own rows copied back: rows the halo makes exact.
At the image's top and bottom the band ends where the image ends, so the filter's
own border rule applies there, as on the whole image; for BORDER_WRAP, whose border
is the far side of the image, the first and last bands gather those rows explicitly.
Left and right borders are the image's own (bands are full width). So the result is
bit-identical to filtering the whole image at once.

On a GPU the bands go through two slots (pinned host buffers, device buffers, a
stream each): while one slot's band is copied in, filtered and copied out, the host
fills the other slot's pinned buffer and empties the finished one into the output,
with a few threads (NumPy copies release the GIL). On Numba's simulator the same
plan runs with plain copies.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from kernels.common.arrays import SIMULATOR, empty

SLOTS = 2
COPY_THREADS = min(16, os.cpu_count() or 1)  # host copies: memory bandwidth, not cores
# Device bytes a band takes besides its input and output rows, per input byte: the
# box kernels' 16-bit row sums and similar scratch, with room to spare.
SCRATCH_PER_BYTE = 2
_LOCK = threading.Lock()


def band_plan(height: int, reach: tuple[int, int], rows: int, wrap: bool) -> list:
    """[(y0, y1, source)] covering output rows [0, height) in bands of at most `rows`
    rows: source is a slice of input rows (a band at the image's top or bottom also
    holds the rows a reflecting border reads there), or (wrap) an index array."""
    top, bottom = reach
    bands = []
    for y0 in range(0, height, rows):
        y1 = min(height, y0 + rows)
        lo, hi = y0 - top, y1 + bottom
        if wrap and (lo < 0 or hi > height):
            source: Any = np.arange(lo, hi) % height
        else:
            # A band at an edge also holds the rows a mirror border reflects back in.
            if lo < 0:
                hi = max(hi, top + 1)
            if hi > height:
                lo = min(lo, height - 1 - bottom)
            source = slice(max(0, lo), min(height, hi))
        bands.append((y0, y1, source))
    return bands


def band_rows(height: int, in_row: int, out_row: int, reach: tuple[int, int], budget: int) -> int:
    """Output rows per band so that SLOTS bands (input with halo, output, scratch) fit
    `budget` bytes of device memory; at least enough rows that a band reaches past
    the halo on both sides. `in_row`/`out_row`: bytes of one input/output row."""
    halo = reach[0] + reach[1]
    per_row = in_row * (1 + SCRATCH_PER_BYTE) + out_row
    rows = (budget // SLOTS - halo * in_row * (1 + SCRATCH_PER_BYTE)) // max(per_row, 1)
    return int(min(height, max(rows, max(reach) + 1, 1)))


def _copy_rows(dst: np.ndarray, src: np.ndarray, pool: ThreadPoolExecutor) -> None:
    """dst[...] = src, split over the pool's threads by rows."""
    chunks = max(1, min(COPY_THREADS, src.nbytes >> 22))  # pieces of 4 MiB or more
    if chunks == 1:
        np.copyto(dst, src)
        return
    edges = np.linspace(0, len(src), chunks + 1).astype(int)
    spans = zip(edges[:-1], edges[1:], strict=True)
    jobs = [pool.submit(np.copyto, dst[a:b], src[a:b]) for a, b in spans]
    for job in jobs:
        job.result()


def _gather(dst: np.ndarray, img: np.ndarray, source, pool: ThreadPoolExecutor) -> None:
    if isinstance(source, slice):
        _copy_rows(dst, img[source], pool)
    else:
        np.take(img, source, axis=0, out=dst)


class _Slot:
    """Host and device buffers and a stream for one band at a time."""

    def __init__(self, in_shape: tuple, out_shape: tuple, dtype, drv, stream: int) -> None:
        self.drv = drv
        self.stream = stream
        self.host_in = _host_buffer(in_shape, dtype, drv)
        self.host_out = _host_buffer(out_shape, dtype, drv)
        self.dev_in = empty(in_shape, dtype, self.stream)
        self.dev_out = empty(out_shape, dtype, self.stream)
        self.pending: tuple | None = None  # (y0, y1, rows) of the band in flight

    def run(self, rows: int, out_rows: int, apply: Callable) -> tuple:
        """Queue: copy `rows` filled input rows in, filter, copy `out_rows` rows out."""
        src, dst = self.dev_in[:rows], self.dev_out[:rows]
        if self.drv is None:
            src.copy_to_device(self.host_in[0][:rows])
            apply(src, dst, self.stream)
            dst.copy_to_host(self.host_out[0][:rows])
        else:
            nbytes = self.host_in[0][:rows].nbytes
            self.drv.upload(src.ptr, self.host_in[1], nbytes, self.stream)
            apply(src, dst, self.stream)
            self.drv.download_async(self.host_out[1], dst.ptr, self.host_out[0][:rows].nbytes,
                                    self.stream)  # fmt: skip
        return src, dst

    def wait(self) -> None:
        if self.drv is not None:
            self.drv.synchronize(self.stream)

    def close(self) -> None:
        if self.drv is not None:
            self.drv.synchronize(self.stream)
            for _, address in (self.host_in, self.host_out):
                self.drv.host_free(address)


_STREAMS: list = []  # the slots' streams, made once per process (the pool keeps
# blocks ordered on them, so they must outlive every band)


def _streams(drv) -> list:
    if drv is None:
        return [0] * SLOTS
    with _LOCK:
        while len(_STREAMS) < SLOTS:
            _STREAMS.append(drv.stream_create())
    return _STREAMS


def _host_buffer(shape: tuple, dtype, drv) -> tuple[np.ndarray, int]:
    """(array, address): page-locked on a GPU, plain NumPy on the simulator."""
    if drv is None:
        arr = np.empty(shape, dtype)
        return arr, arr.ctypes.data
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    address = drv.host_alloc(nbytes)
    buffer = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_ubyte * nbytes).from_address(address))
    return buffer.view(dtype).reshape(shape), address


def filter_in_bands(img: np.ndarray, out: np.ndarray, reach: tuple[int, int], wrap: bool,
                    apply: Callable[[Any, Any, int], Any], budget: int) -> np.ndarray:  # fmt: skip
    """Filter host image `img` (H, W, C) into host `out` (H, ...) band by band.

    reach: (rows above, rows below) an output row depends on. wrap: the vertical
    border is BORDER_WRAP. apply(src, dst, stream): queue the whole-image filter of
    device band `src` into device band `dst` (same rows) on `stream`. budget: device
    bytes the bands may take. Returns `out`.
    """
    height = img.shape[0]
    in_row = img[0].nbytes
    out_row = out[0].nbytes
    rows = band_rows(height, in_row, out_row, reach, budget)
    plan = band_plan(height, reach, rows, wrap)
    most = max(len(range(height)[s]) if isinstance(s, slice) else len(s) for _, _, s in plan)
    drv = None
    if not SIMULATOR:
        from kernels.common.cudadrv import driver

        drv = driver()
    streams = _streams(drv)
    slots = [_Slot((most, *img.shape[1:]), (most, *out.shape[1:]), img.dtype, drv, stream)
             for stream in streams[: min(SLOTS, len(plan))]]  # fmt: skip
    try:
        with ThreadPoolExecutor(COPY_THREADS) as pool:
            for i, (y0, y1, source) in enumerate(plan):
                slot = slots[i % len(slots)]
                _finish(slot, out, pool)
                n = len(range(height)[source]) if isinstance(source, slice) else len(source)
                _gather(slot.host_in[0][:n], img, source, pool)
                offset = y0 - (source.start if isinstance(source, slice) else y0 - reach[0])
                slot.run(n, n, apply)
                slot.pending = (y0, y1, offset)
            for slot in slots:
                _finish(slot, out, pool)
    finally:
        for slot in slots:
            slot.close()
    return out


def _finish(slot: _Slot, out: np.ndarray, pool: ThreadPoolExecutor) -> None:
    """Wait for the slot's band in flight, if any, and copy its own rows into `out`."""
    if slot.pending is None:
        return
    slot.wait()
    y0, y1, offset = slot.pending
    _copy_rows(out[y0:y1], slot.host_out[0][offset : offset + y1 - y0], pool)
    slot.pending = None
