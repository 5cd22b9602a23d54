"""The generic 2-D correlation kernels: any kernel size, weights read at run time.

Same contract as `kernels.conv.dispatch.correlate`, which launches them by their
`kernels.common.refs.KernelRef`s in `kernels.conv.launch` (importing this module, and
so Numba, only where a kernel does not ship): (H, W, C) device images, (kh, kw)
float32 weights (not flipped), borders by `kernels.common.border_index` code, float32
accumulation, integer outputs rounded half to even and saturated as cv2.filter2D does.
Every variant sums the taps in one order, column by column (each column top to
bottom), each tap a fused multiply-add: the order of the register-blocked kernel
(`kernels.conv.blocked`), so that every method gives the same bits (method auto runs
tiled while blocked compiles). Variants:
- naive: one thread per output pixel, reads global memory, maps borders per tap.
- padded: a pad kernel builds the bordered image first; the correlation then has
  no bounds logic in its inner loop.
- tiled: a block loads its output tile plus halo (and the weights) into shared
  memory once; every tap then reads shared memory.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from ..common.device import border_index, saturate_int


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
    for j in range(kw):
        xx = border_index(x + j - ax, width, mode)
        for i in range(kh):
            yy = border_index(y + i - ay, height, mode)
            if yy < 0 or xx < 0:
                v = outside
            else:
                v = np.float32(img[yy, xx, c])
            acc = cuda.fma(weights[i, j], v, acc)
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
    for j in range(kw):
        for i in range(kh):
            acc = cuda.fma(weights[i, j], np.float32(padded[y + i, x + j, c]), acc)
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
    for j in range(kw):
        col = ty * tile_w + tx + j
        for i in range(kh):
            acc = cuda.fma(smem[wbase + i * kw + j], smem[col + i * tile_w], acc)
    if is_int:
        out[y, x, c] = saturate_int(acc, lo, hi)
    else:
        out[y, x, c] = acc


# ---------------------------------------------------------------- launch functions
