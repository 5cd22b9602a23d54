"""2-D correlation kernels (OpenCV's filter2D semantics) in Numba CUDA.

Images are (H, W, C) device arrays of uint8, uint16 or float32; outputs have the
input's dtype and shape. Weights are a (kh, kw) float32 device array, not flipped.
The anchor (ay, ax) is the weight placed on the output pixel. Borders use
`kernels.border_index` codes; `cval` is the constant-border value, already cast to
the image's dtype. Accumulation is float32; integer outputs are rounded half to even
and saturated to [lo, hi] (`is_int`), as cv2.filter2D does.

Box filters live in `kernels.box`. Variants here, all computing the same thing:
- naive: one thread per output pixel, reads global memory, maps borders per tap.
- padded: a pad kernel builds the bordered image first; the correlation then has
  no bounds logic in its inner loop.
- tiled: a block loads its output tile plus halo (and the weights) into shared
  memory once; every tap then reads shared memory.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from .arrays import empty
from .conv_plan import tiled_fits, tiled_smem_bytes  # noqa: F401 - part of this module's API
from .device import border_index, saturate_int
from .launch import SMEM_LIMIT, image_grid, launch, scratch
from .saturate import output_limits


@cuda.jit(cache=True)
def correlate_naive(img, weights, ay, ax, mode, cval, lo, hi, is_int, out):
    x, y = cuda.grid(2)
    c = cuda.blockIdx.z
    height, width = img.shape[0], img.shape[1]
    if y >= height or x >= width:
        return
    kh, kw = weights.shape
    outside = np.float32(cval)
    acc = np.float32(0.0)
    for i in range(kh):
        yy = border_index(y + i - ay, height, mode)
        for j in range(kw):
            xx = border_index(x + j - ax, width, mode)
            if yy < 0 or xx < 0:
                v = outside
            else:
                v = np.float32(img[yy, xx, c])
            acc += weights[i, j] * v
    if is_int:
        out[y, x, c] = saturate_int(acc, lo, hi)
    else:
        out[y, x, c] = acc


@cuda.jit(cache=True)
def pad_image(img, top, left, mode, cval, padded):
    """padded[y, x, c] = img at (y - top, x - left) with the border rule applied."""
    x, y = cuda.grid(2)
    c = cuda.blockIdx.z
    if y >= padded.shape[0] or x >= padded.shape[1]:
        return
    yy = border_index(y - top, img.shape[0], mode)
    xx = border_index(x - left, img.shape[1], mode)
    if yy < 0 or xx < 0:
        padded[y, x, c] = cval
    else:
        padded[y, x, c] = img[yy, xx, c]


@cuda.jit(cache=True)
def correlate_valid(padded, weights, lo, hi, is_int, out):
    """out[y, x] = sum_ij weights[i, j] * padded[y + i, x + j]: no border logic."""
    x, y = cuda.grid(2)
    c = cuda.blockIdx.z
    if y >= out.shape[0] or x >= out.shape[1]:
        return
    kh, kw = weights.shape
    acc = np.float32(0.0)
    for i in range(kh):
        for j in range(kw):
            acc += weights[i, j] * np.float32(padded[y + i, x + j, c])
    if is_int:
        out[y, x, c] = saturate_int(acc, lo, hi)
    else:
        out[y, x, c] = acc


@cuda.jit(cache=True)
def correlate_tiled(img, weights, ay, ax, mode, cval, lo, hi, is_int, out):
    """One block computes a BLOCK_Y x BLOCK_X output tile from shared memory.

    Dynamic shared memory holds the tile with its halo, (BLOCK_Y + kh - 1) rows of
    (BLOCK_X + kw - 1) floats, followed by the kh * kw weights.
    """
    smem = cuda.shared.array(0, dtype=float32)
    height, width = img.shape[0], img.shape[1]
    kh, kw = weights.shape
    c = cuda.blockIdx.z
    tile_w = cuda.blockDim.x + kw - 1
    tile_h = cuda.blockDim.y + kh - 1
    y0 = cuda.blockIdx.y * cuda.blockDim.y - ay
    x0 = cuda.blockIdx.x * cuda.blockDim.x - ax
    tid = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    nthreads = cuda.blockDim.x * cuda.blockDim.y
    outside = np.float32(cval)

    for idx in range(tid, tile_h * tile_w, nthreads):
        r = idx // tile_w
        q = idx - r * tile_w
        yy = border_index(y0 + r, height, mode)
        xx = border_index(x0 + q, width, mode)
        if yy < 0 or xx < 0:
            smem[idx] = outside
        else:
            smem[idx] = np.float32(img[yy, xx, c])
    wbase = tile_h * tile_w
    for idx in range(tid, kh * kw, nthreads):
        smem[wbase + idx] = weights[idx // kw, idx % kw]
    cuda.syncthreads()

    x, y = cuda.grid(2)
    if y >= height or x >= width:
        return
    ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
    acc = np.float32(0.0)
    for i in range(kh):
        row = (ty + i) * tile_w + tx
        wrow = wbase + i * kw
        for j in range(kw):
            acc += smem[wrow + j] * smem[row + j]
    if is_int:
        out[y, x, c] = saturate_int(acc, lo, hi)
    else:
        out[y, x, c] = acc


# ---------------------------------------------------------------- launch functions


def correlate(img, weights, anchor, mode, cval, method, out=None, stream: int = 0):
    """Correlate a device image (H, W, C) with device weights (kh, kw); return `out`.

    method: "naive", "padded", "tiled" or "blocked" (the caller resolves "auto").
    Queued on `stream`.
    """
    height, width, channels = img.shape
    kh, kw = weights.shape
    ay, ax = anchor
    lo, hi, is_int = output_limits(img.dtype)
    if out is None:
        out = empty(img.shape, img.dtype, stream)
    grid, block = image_grid(height, width, channels)
    if method == "naive":
        args = (img, weights, ay, ax, mode, cval, lo, hi, is_int, out)
        launch(correlate_naive, grid, block, args, stream)
    elif method == "padded":
        padded = scratch((height + kh - 1, width + kw - 1, channels), img.dtype, stream)
        pgrid, _ = image_grid(padded.shape[0], padded.shape[1], channels)
        launch(pad_image, pgrid, block, (img, ay, ax, mode, cval, padded), stream)
        launch(correlate_valid, grid, block, (padded, weights, lo, hi, is_int, out), stream)
    elif method == "blocked":
        from .conv_blocked import correlate_blocked

        correlate_blocked(img, weights, anchor, mode, cval, out, stream=stream)
    elif method == "tiled":
        smem = tiled_smem_bytes(kh, kw)
        if smem > SMEM_LIMIT:
            raise ValueError(f"a {kh}x{kw} kernel needs {smem} bytes of shared memory")
        args = (img, weights, ay, ax, mode, cval, lo, hi, is_int, out)
        launch(correlate_tiled, grid, block, args, stream, smem)
    else:
        raise ValueError(f"unknown correlation method {method!r}")
    return out
