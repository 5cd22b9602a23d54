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
from numba import cuda

from . import border_index as _bi
from . import gray as _gray
from .launch import image_grid

border_index = cuda.jit(device=True)(_bi.border_index)
bgr_to_gray = cuda.jit(device=True)(_gray.bgr_to_gray)


@cuda.jit(device=True)
def _clip(v, hi):
    if v < 0:
        return 0
    if v > hi:
        return hi
    return v


@cuda.jit(device=True)
def _gray_at(img, y, x):
    if img.shape[2] == 1:
        return np.int64(img[y, x, 0])
    b = np.int64(img[y, x, 0])
    g = np.int64(img[y, x, 1])
    r = np.int64(img[y, x, 2])
    return bgr_to_gray(b, g, r)


@cuda.jit
def contour_fused(img, mode, cval, hi, out):
    """out[y, x] = sat(gx) | sat(-gx) | sat(gy) | sat(-gy) over the 3x3 gray neighbourhood.

    Colour pixels are converted to gray as they are read, so the whole operation is
    this one launch with no intermediate image.
    """
    x, y = cuda.grid(2)
    height, width = img.shape[0], img.shape[1]
    if y >= height or x >= width:
        return
    gx = 0
    gy = 0
    for i in range(3):
        yy = border_index(y + i - 1, height, mode)
        for j in range(3):
            xx = border_index(x + j - 1, width, mode)
            if yy < 0 or xx < 0:
                v = cval
            else:
                v = _gray_at(img, yy, xx)
            gx += (j - 1) * v
            gy += (i - 1) * v
    out[y, x] = _clip(gx, hi) | _clip(-gx, hi) | _clip(gy, hi) | _clip(-gy, hi)


def contour(img, mode: int, cval: int, out=None):
    """Contour map of a device image (H, W, C), C in {1, 3, 4}, uint8 or uint16.

    Returns an (H, W) device array of the image's dtype.
    """
    height, width, channels = img.shape
    hi = int(np.iinfo(np.dtype(img.dtype)).max)
    grid, block = image_grid(height, width, 1)
    if out is None:
        out = cuda.device_array((height, width), dtype=img.dtype)
    contour_fused[grid, block](img, mode, np.int64(cval), hi, out)
    return out
