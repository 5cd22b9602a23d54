"""What the CPU backend's modules share: roundoff units, border index maps, padding,
OpenCV's box scaling and the worker-thread count. NumPy and plain Python only (no
Numba), imported by `cpu`, `cpu_box`, `cpu_fft` and `cpu_loops`, importing none of them.
"""

from __future__ import annotations

import math
import os
import sys
import threading

import numpy as np

from kernels.common import border_index as _bi

U32 = 2.0**-24  # unit roundoff of float32
U64 = 2.0**-53  # unit roundoff of float64
CHUNK = 512  # output elements per task of the direct loops (accumulators stay in L1)

# box scaling modes (see box_scaling)
BOX_FLOAT = 0  # float32 image: float32(sum * (1.0 / area)), sum and scale in double
BOX_COPY = 1  # area 1: the sum itself
BOX_FIXED = 2  # uint8, area <= 256: ((sum + delta) * mul) >> 23, OpenCV's fixed point
BOX_F32 = 3  # int sums: round(float32(sum) * float32(1 / area))
BOX_F64 = 4  # double sums (huge boxes): round(sum * (1.0 / area))
FIXED_SHIFT = 23


def box_scaling(dtype, area: int) -> tuple[int, int, int]:
    """(mode, delta, mul): how cv2.blur turns an exact box sum into the output value.

    OpenCV (box_filter.simd.hpp, checked against cv2.blur on random data):
    - uint8 with area <= 256 sums in uint16 and scales in fixed point with a 23-bit
      shift: d = area, mul = 2**23 / d rounded to the nearer integer and delta = d // 2,
      plus 1 when mul was rounded down. ((s + delta) * mul) >> 23 is round(s / d) except
      where it rounds up below a tie (2 pixels: (s + 2) >> 1, so a 2x1 box of zeros is 1).
      OpenCV's SIMD body saturates at 255; its scalar tail wraps 256 to 0 (a 2x1 box of
      255s then gives 0, an OpenCV bug). We saturate.
    - uint8 with larger boxes and uint16 sum in int32 and multiply in float32
      (SIMD body; the scalar tail multiplies in double) then round half to even.
    - sums too large for int32 (uint8 area > 2**23, uint16 area > 2**15) are double,
      scaled in double. float32 images sum in double and store float32(s * (1 / d)).
    """
    dt = np.dtype(dtype)
    if dt == np.float32:
        return BOX_FLOAT, 0, 0
    if area == 1:
        return BOX_COPY, 0, 0
    if dt == np.uint8 and area <= 256:
        scalef = float(1 << FIXED_SHIFT) / area
        mul = math.floor(scalef)
        delta = area // 2
        if scalef - mul < 0.5:
            delta += 1
        else:
            mul += 1
        return BOX_FIXED, delta, mul
    if area > (1 << 23 if dt == np.uint8 else 1 << 15):
        return BOX_F64, 0, 0
    return BOX_F32, 0, 0


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
    numba = sys.modules.get("numba")
    if numba is not None:
        return numba.get_num_threads()
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
