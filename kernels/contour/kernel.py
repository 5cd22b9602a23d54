"""The contour map: four 3x3 direction kernels, saturated and OR-merged, in one pass.

For a gray integer image (H, W) the responses are gx = right - left column sums and
gy = bottom - top row sums of the 3x3 neighbourhood (the kernels [[-1,0,1]]*3 and
[[-1,-1,-1],[0,0,0],[1,1,1]]) and their negations. Each of the four is saturated to
[0, hi] and the four are OR-ed bitwise: exactly four cv2.filter2D calls followed by
cv2.bitwise_or, computed by one kernel reading each neighbourhood once.
Colour images are converted to gray (as cv2.cvtColor does) inside the same kernel.

This module makes the kernel (`_make_contour_fused`, importing Numba); it is launched
by `kernels.contour.launch.contour`, which names it by `kernels.common.refs.KernelRef`
and imports this module only where the kernel does not ship.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int32, uint64

from ..common.device import bgr_to_gray, border_index
from ..common.refs import kernel_factory
from .plan import RUN_Y


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


@kernel_factory
def _make_contour_fused(channels: int):
    """The kernel for images of `channels` channels (a compile-time constant, so the
    interior walk has no per-pixel channel test); one per channel count, named by it
    (`kernels.contour.launch.contour_kernel` is its `KernelRef`): a plain int."""
    C = channels

    @cuda.jit(cache=True)
    def contour_fused(img, flat, mode, cval, hi, out, out_flat):
        """out[y, x] = sat(gx) | sat(-gx) | sat(gy) | sat(-gy) over the 3x3 gray neighbourhood.

        Each thread walks RUN_Y rows down one column, keeping for the three rows of its
        window the row sum (left + centre + right) and difference (right - left): a new
        output row costs three reads. Border mapping happens once per column and once per
        row, not per tap. Colour pixels are converted to gray as they are read, so the
        whole operation is this one launch with no intermediate image.
        """
        x = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        y0 = cuda.blockIdx.y * RUN_Y
        height, width = img.shape[0], img.shape[1]
        if x >= width:
            return
        if x >= 1 and x + 1 < width and y0 >= 1 and y0 + RUN_Y < height:
            _walk_interior(flat, x, y0, width, C, hi, out_flat)
            return
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
            out[uint64(y), uint64(x)] = _edge_or(
                diff_top + diff_mid + diff_bot, sum_bot - sum_top, hi
            )
            sum_top, diff_top = sum_mid, diff_mid
            sum_mid, diff_mid = sum_bot, diff_bot

    return contour_fused


@cuda.jit(device=True)
def _gray_flat(src, off, channels):
    """Gray value of the pixel whose first channel is src[off] (flat image, off >= 0)."""
    if channels == 1:
        return int32(src[off])
    one = uint64(1)  # uint64 + int would be float64 under NumPy < 2 in the simulator
    return int32(bgr_to_gray(int32(src[off]), int32(src[off + one]), int32(src[off + one + one])))


@cuda.jit(device=True)
def _terms(src, off, channels):
    """(left + centre + right, right - left) of the gray row whose centre pixel is at off.

    The int32 casts here and in _edge_or keep the arithmetic 32-bit (Numba widens
    integer arithmetic to 64 bits, which costs two instructions or more per step).
    """
    step = uint64(channels)
    left = _gray_flat(src, off - step, channels)
    right = _gray_flat(src, off + step, channels)
    return int32(left + _gray_flat(src, off, channels) + right), int32(right - left)


@cuda.jit(device=True)
def _edge_or(gx, gy, hi):
    """sat(gx) | sat(-gx) | sat(gy) | sat(-gy): at most one of each pair is non-zero."""
    ax = int32(abs(int32(gx)))
    ay = int32(abs(int32(gy)))
    h = int32(hi)
    return int32(min(ax, h) | min(ay, h))


@cuda.jit(device=True)
def _walk_interior(src, x, y0, width, channels, hi, dst):
    """RUN_Y outputs down column x where the whole window is inside the image.

    src is the image and dst the output, both flattened. All ten row reads are issued
    before the first store: a store could alias a later read as far as the compiler
    knows, so interleaving them would cost one memory round trip per row.
    """
    pitch = uint64(width * channels)
    o = uint64(((y0 - 1) * width + x) * channels)
    s0, d0 = _terms(src, o, channels)
    s1, d1 = _terms(src, o + pitch, channels)
    s2, d2 = _terms(src, o + uint64(2) * pitch, channels)
    s3, d3 = _terms(src, o + uint64(3) * pitch, channels)
    s4, d4 = _terms(src, o + uint64(4) * pitch, channels)
    s5, d5 = _terms(src, o + uint64(5) * pitch, channels)
    s6, d6 = _terms(src, o + uint64(6) * pitch, channels)
    s7, d7 = _terms(src, o + uint64(7) * pitch, channels)
    s8, d8 = _terms(src, o + uint64(8) * pitch, channels)
    s9, d9 = _terms(src, o + uint64(9) * pitch, channels)
    q = uint64(y0 * width + x)
    w = uint64(width)
    dst[q] = _edge_or(d0 + d1 + d2, s2 - s0, hi)
    dst[q + w] = _edge_or(d1 + d2 + d3, s3 - s1, hi)
    dst[q + uint64(2) * w] = _edge_or(d2 + d3 + d4, s4 - s2, hi)
    dst[q + uint64(3) * w] = _edge_or(d3 + d4 + d5, s5 - s3, hi)
    dst[q + uint64(4) * w] = _edge_or(d4 + d5 + d6, s6 - s4, hi)
    dst[q + uint64(5) * w] = _edge_or(d5 + d6 + d7, s7 - s5, hi)
    dst[q + uint64(6) * w] = _edge_or(d6 + d7 + d8, s8 - s6, hi)
    dst[q + uint64(7) * w] = _edge_or(d7 + d8 + d9, s9 - s7, hi)
