"""What the CPU backend's modules share: roundoff units, border index maps, padding,
direct sums at chosen outputs and the worker threads. NumPy and plain Python only (no
Numba), imported by `cpu`, `cpu_box` and `cpu_fft`, importing none of them.
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

from kernels.common import border_index as _bi

U32 = 2.0**-24  # unit roundoff of float32
U64 = 2.0**-53  # unit roundoff of float64


def axis_map(n: int, before: int, after: int, mode: int) -> np.ndarray:
    """Source index (int64) for each of before + n + after positions along an axis of
    n pixels: `border_index` of p - before; -1 is the constant border. NumPy and plain
    Python (only the border positions call `border_index`): no compile on first use."""
    out = np.empty(before + n + after, np.int64)
    out[before : before + n] = np.arange(n)
    for p in (*range(before), *range(before + n, before + n + after)):
        out[p] = _bi.border_index(p - before, n, mode)
    return out


def padded(img, top, bottom, left, right, border, value, dtype) -> np.ndarray:
    """(H, W, C) -> (H + top + bottom, (W + left + right) * C) of `dtype`: the image
    extended by `border` (`axis_map`; the constant border holds `value`, converted to
    `dtype` as the array stores it)."""
    h, w, c = img.shape
    rows = axis_map(h, top, bottom, border)
    cols = axis_map(w, left, right, border)
    out = np.empty((rows.shape[0], cols.shape[0], c), dtype)
    out[:, left : left + w] = img[np.maximum(rows, 0)]
    edge = np.r_[0:left, left + w : cols.shape[0]]
    if edge.size:
        src = cols[edge]
        out[:, edge] = out[:, left + np.maximum(src, 0)]
        out[:, edge[src < 0]] = value
    out[rows < 0] = value
    return out.reshape(rows.shape[0], -1)


def threads() -> int:
    """Worker threads of the CPU paths: Numba's thread count when Numba is loaded, else
    the count Numba would take (NUMBA_NUM_THREADS, or the CPUs this process may use),
    so that work split by it is split the same way whether or not Numba is loaded."""
    get = getattr(sys.modules.get("numba"), "get_num_threads", None)  # None: not loaded
    if get is not None:
        return get()
    env = os.environ.get("NUMBA_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def run_parallel(fn, count: int, workers: int) -> None:
    """fn(i) for i in range(count) on up to `workers` threads (the calling one among
    them), each thread taking the next i in turn; the first error is raised here once
    every thread has stopped. Plain threads: concurrent.futures costs a command 5-10 ms
    to import. The work must release the GIL (NumPy, OpenCV) to run in parallel."""
    workers = max(1, min(workers, count))
    if workers == 1:
        for i in range(count):
            fn(i)
        return
    lock = threading.Lock()
    pending = iter(range(count))
    errors: list[BaseException] = []

    def work() -> None:
        while not errors:
            with lock:
                i = next(pending, None)
            if i is None:
                return
            try:
                fn(i)
            except BaseException as e:  # noqa: BLE001 - raised in the calling thread
                errors.append(e)

    pool = [threading.Thread(target=work) for _ in range(workers - 1)]
    for t in pool:
        t.start()
    work()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def direct_sums(flat, bases, rowlen: int, nch: int, k64) -> np.ndarray:
    """The direct float64 correlation at the outputs whose windows start at offsets
    `bases` of `flat` (rows of `rowlen` values, `nch` interleaved channels): k64[i, j]
    * flat[base + i * rowlen + j * nch] over the non-zero taps in row-major order, from
    +0, multiply then add, one tap at a time over every output (the fastest order in
    NumPy; NumPy adds pairwise only in reductions, not in these element-wise adds).
    Each product of a float32 weight and a pixel (float32, uint8 or uint16) is exact in
    float64. A sum from +0 is never -0."""
    sums = np.zeros(bases.shape[0])
    term = np.empty(bases.shape[0])
    for i, j in zip(*np.nonzero(k64), strict=True):
        np.multiply(flat[bases + (i * rowlen + j * nch)], k64[i, j], out=term)
        sums += term
    return sums
