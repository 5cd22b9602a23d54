"""Host images larger than the GPU's memory (or a budget), filtered in row bands.

A band of output rows needs the input rows it covers plus the filter's reach above
and below (`reach`: rows of halo). Each band is copied to the GPU, filtered there as
if it were a whole image, and its own rows copied back: rows the halo makes exact.
At the image's top and bottom the band ends where the image ends, so the filter's
own border rule applies there, as on the whole image; for BORDER_WRAP, whose border
is the far side of the image, the first and last bands gather those rows explicitly.
Left and right borders are the image's own (bands are full width). So the result is
bit-identical to filtering the whole image at once.

On a GPU the bands go through SLOTS slots (pinned host buffers, device buffers, a
stream each): while one slot's band is copied in, filtered and copied out, the host
fills another slot's pinned buffer and empties a finished one into the output, with a
few threads (NumPy copies release the GIL). Bands hold at most BAND_BYTES of input
whatever the budget: page-locking host memory costs about as much as copying it
several times over (an H100 host: 0.65 s for 1 GiB), so the pinned buffers stay small
and are kept for the next call (`release_pinned` gives them back). A large result
is allocated by `imgfilter.hostmem.host_empty` (huge pages, and the memory of a
dropped result of the same size reused: its first writes fault nothing). On Numba's
simulator the same plan runs with plain copies.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from kernels.common.arrays import SIMULATOR, empty
from kernels.common.cudadrv import address

from . import pinned
from .hostmem import host_empty

SLOTS = 3
BAND_BYTES = 64 << 20  # input bytes a band holds at most (its halo aside)
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


def band_rows(height: int, in_row: int, out_row: int, reach: tuple[int, int], budget: int,
              band_bytes: int = BAND_BYTES) -> int:  # fmt: skip
    """Output rows per band so that SLOTS bands (input with halo, output, scratch) fit
    `budget` bytes of device memory and a band's input rows stay within `band_bytes`;
    at least enough rows that a band reaches past the halo on both sides.
    `in_row`/`out_row`: bytes of one input/output row."""
    halo = reach[0] + reach[1]
    per_row = in_row * (1 + SCRATCH_PER_BYTE) + out_row
    rows = (budget // SLOTS - halo * in_row * (1 + SCRATCH_PER_BYTE)) // max(per_row, 1)
    rows = min(rows, band_bytes // max(in_row, out_row, 1))
    return int(min(height, max(rows, max(reach) + 1, 1)))


def join_rows(parts: list[np.ndarray]) -> np.ndarray:
    """np.concatenate(parts, axis=0) of C-contiguous host arrays, into `host_empty`
    memory, the copies split over COPY_THREADS threads (one thread copies a 200 MB
    band in about 70 ms on an H100 host, mostly faulting in the fresh pages)."""
    rows = sum(p.shape[0] for p in parts)
    out = host_empty((rows, *parts[0].shape[1:]), np.result_type(*parts))
    with ThreadPoolExecutor(COPY_THREADS) as pool:
        jobs, y = [], 0
        for part in parts:
            jobs += _copy_rows(out[y : y + part.shape[0]], part, pool)
            y += part.shape[0]
        _wait(jobs)
    return out


def _copy_rows(dst: np.ndarray, src: np.ndarray, pool: ThreadPoolExecutor) -> list:
    """Start dst[...] = src, split over the pool's threads by rows; returns the jobs
    (none when the copy was small enough to make here)."""
    chunks = max(1, min(COPY_THREADS, src.nbytes >> 22))  # pieces of 4 MiB or more
    if chunks == 1:
        np.copyto(dst, src)
        return []
    edges = np.linspace(0, len(src), chunks + 1).astype(int)
    spans = zip(edges[:-1], edges[1:], strict=True)
    return [pool.submit(np.copyto, dst[a:b], src[a:b]) for a, b in spans]


def _gather(dst: np.ndarray, img: np.ndarray, source, pool: ThreadPoolExecutor) -> list:
    """Start copying a band's input rows (a slice, or wrap's index array) into dst."""
    if isinstance(source, slice):
        return _copy_rows(dst, img[source], pool)
    np.take(img, source, axis=0, out=dst)
    return []


def _wait(jobs: list) -> None:
    for job in jobs:
        job.result()


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
                pinned.keep(address)


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
    """(array, address) of a slot's page-locked buffer (`imgfilter.pinned`), or of
    plain NumPy memory on the simulator and past the pinned limit."""
    got = pinned.take(shape, dtype, drv)
    if got is None:
        arr = np.empty(shape, dtype)
        return arr, address(arr)
    return got


def release_pinned() -> int:
    """Free the page-locked host buffers kept for later calls (those not in use);
    returns the bytes freed. The next large call allocates them again."""
    return pinned.release()


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
                n = len(range(height)[source]) if isinstance(source, slice) else len(source)
                # The slot's last band out and this band in, at once: separate buffers.
                jobs = _finish(slot, out, pool)
                _wait(jobs + _gather(slot.host_in[0][:n], img, source, pool))
                offset = y0 - (source.start if isinstance(source, slice) else y0 - reach[0])
                slot.run(n, n, apply)
                slot.pending = (y0, y1, offset)
            for slot in slots:
                _wait(_finish(slot, out, pool))
    finally:
        for slot in slots:
            slot.close()
    return out


def _finish(slot: _Slot, out: np.ndarray, pool: ThreadPoolExecutor) -> list:
    """Wait for the slot's band in flight, if any, and start copying its own rows
    into `out`; returns the copy's jobs."""
    if slot.pending is None:
        return []
    slot.wait()
    y0, y1, offset = slot.pending
    slot.pending = None
    return _copy_rows(out[y0:y1], slot.host_out[0][offset : offset + y1 - y0], pool)
