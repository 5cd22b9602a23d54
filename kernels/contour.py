"""The contour map: four 3x3 direction kernels, saturated and OR-merged, in one pass.

For a gray integer image (H, W) the responses are gx = right - left column sums and
gy = bottom - top row sums of the 3x3 neighbourhood (the kernels [[-1,0,1]]*3 and
[[-1,-1,-1],[0,0,0],[1,1,1]]) and their negations. Each of the four is saturated to
[0, hi] and the four are OR-ed bitwise: exactly four cv2.filter2D calls followed by
cv2.bitwise_or, computed by one kernel reading each neighbourhood once.
Colour images are converted to gray (as cv2.cvtColor does) inside the same kernel.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int32, uint64

from .device import bgr_to_gray, border_index
from .launch import cdiv

THREADS = 128  # threads per block, side by side along a row
COLS = 4  # adjacent columns per thread
RUN_Y = 16  # rows per thread
STEP = 8  # rows whose loads are issued together in the interior
WINDOW = (STEP + 2, COLS + 2)  # gray values an interior step reads


@cuda.jit(device=True)
def _clip(v, hi):
    if v < 0:
        return 0
    if v > hi:
        return hi
    return v


@cuda.jit(device=True)
def _gray_at(img, y, x):
    # y, x >= 0 here; unsigned indices spare Numba's negative-index wraparound.
    uy = uint64(y)
    ux = uint64(x)
    if img.shape[2] == 1:
        return np.int64(img[uy, ux, 0])
    b = np.int64(img[uy, ux, 0])
    g = np.int64(img[uy, ux, 1])
    r = np.int64(img[uy, ux, 2])
    return bgr_to_gray(b, g, r)


@cuda.jit(device=True)
def _pixel(img, yy, xx, cval):
    """Gray value at a mapped position; -1 coordinates mean the constant border."""
    if yy < 0 or xx < 0:
        return cval
    return _gray_at(img, yy, xx)


@cuda.jit(device=True)
def _walk_column(img, x, y0, mode, cval, hi, out):
    """RUN_Y outputs down column x from row y0, borders mapped (the general path).

    Keeps for the three rows of the window the row sum (left + centre + right) and
    difference (right - left): a new output row costs three reads. Border mapping
    happens once per column and once per row, not per tap.
    """
    height, width = img.shape[0], img.shape[1]
    xl = border_index(x - 1, width, mode)
    xc = x
    xr = border_index(x + 1, width, mode)

    yy = border_index(y0 - 1, height, mode)
    left = _pixel(img, yy, xl, cval)
    right = _pixel(img, yy, xr, cval)
    sum_top = left + _pixel(img, yy, xc, cval) + right
    diff_top = right - left
    yy = border_index(y0, height, mode)
    left = _pixel(img, yy, xl, cval)
    right = _pixel(img, yy, xr, cval)
    sum_mid = left + _pixel(img, yy, xc, cval) + right
    diff_mid = right - left

    for y in range(y0, min(y0 + RUN_Y, height)):
        yy = border_index(y + 1, height, mode)
        left = _pixel(img, yy, xl, cval)
        right = _pixel(img, yy, xr, cval)
        sum_bot = left + _pixel(img, yy, xc, cval) + right
        diff_bot = right - left
        out[uint64(y), uint64(x)] = _edges(diff_top + diff_mid + diff_bot, sum_bot - sum_top, hi)
        sum_top, diff_top = sum_mid, diff_mid
        sum_mid, diff_mid = sum_bot, diff_bot


@cuda.jit(cache=True)
def contour_fused(img, mode, cval, hi, out):
    """out[y, x] = sat(gx) | sat(-gx) | sat(gy) | sat(-gy) over the 3x3 gray neighbourhood.

    Each thread owns COLS adjacent columns and RUN_Y rows. Colour pixels are
    converted to gray as they are read, so the whole operation is this one launch
    with no intermediate image. Threads whose window stays inside the image take
    `_interior_block`; the others walk their columns with border mapping.
    """
    x0 = (cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x) * COLS
    y0 = cuda.blockIdx.y * RUN_Y
    height, width = img.shape[0], img.shape[1]
    if x0 >= width:
        return
    if x0 >= 1 and x0 + COLS < width and y0 >= 1 and y0 + RUN_Y < height:
        for y in range(y0, y0 + RUN_Y, STEP):
            _interior_block(img, x0, y, hi, out)
        return
    for x in range(x0, min(x0 + COLS, width)):
        _walk_column(img, x, y0, mode, cval, hi, out)


@cuda.jit(device=True)
def _edges(gx, gy, hi):
    return _clip(gx, hi) | _clip(-gx, hi) | _clip(gy, hi) | _clip(-gy, hi)


@cuda.jit(device=True)
def _interior_block(img, x0, y0, hi, out):
    """STEP x COLS outputs at (y0, x0) whose 3x3 windows are all inside the image.

    Every gray value of the (STEP + 2) x (COLS + 2) window is loaded before any
    output is stored: the compiler may not move a load past a store to another
    array (they could alias), so loads interleaved with stores would each wait
    for memory in turn.
    """
    g = cuda.local.array(WINDOW, int32)
    for i in range(STEP + 2):
        for j in range(COLS + 2):
            g[i, j] = _gray_at(img, y0 - 1 + i, x0 - 1 + j)
    for i in range(STEP):
        uy = uint64(y0 + i)
        for j in range(COLS):
            gx = (g[i, j + 2] + g[i + 1, j + 2] + g[i + 2, j + 2]) - (
                g[i, j] + g[i + 1, j] + g[i + 2, j]
            )
            gy = (g[i + 2, j] + g[i + 2, j + 1] + g[i + 2, j + 2]) - (
                g[i, j] + g[i, j + 1] + g[i, j + 2]
            )
            out[uy, uint64(x0 + j)] = _edges(gx, gy, hi)


def contour(img, mode: int, cval: int, out=None):
    """Contour map of a device image (H, W, C), C in {1, 3, 4}, uint8 or uint16.

    Returns an (H, W) device array of the image's dtype.
    """
    height, width, channels = img.shape
    hi = int(np.iinfo(np.dtype(img.dtype)).max)
    grid = (cdiv(width, THREADS * COLS), cdiv(height, RUN_Y))
    block = THREADS
    if out is None:
        out = cuda.device_array((height, width), dtype=img.dtype)
    contour_fused[grid, block](img, mode, np.int64(cval), hi, out)
    return out
