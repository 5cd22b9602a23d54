"""The register-window correlation kernel: any kernel size, weights read at run time.

Same contract as `kernels.conv.dispatch.correlate`, which launches it by its
`kernels.common.refs.KernelRef` in `kernels.conv.launch`. A block of
TX x TY threads stages its input tile (with the kernel's halo) and the weights in
dynamic shared memory, both column-major, then each thread computes RY outputs down
one image column. For kernel column j it keeps a window of RY consecutive tile values
of its column in registers: each kernel row i costs one weight read (the same for
the whole warp), one tile read and RY multiply-adds, where the one-output-per-thread
`tiled` kernel reads shared memory twice per multiply-add. The window is RY scalars
(written out: Numba keeps scalars in registers), its rows shift by one per kernel row.

Taps are summed column by column, each column top to bottom, each a fused
multiply-add: the order of `kernels.conv.blocked` and `kernels.conv.generic`, so it
gives their bits. The register-blocked kernel is faster still (its loops are unrolled
for one kernel size, which costs a compile per size); this one is compiled once per
dtype, for method auto while a size's blocked kernel compiles and for kernels larger
than the blocked kernel takes.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32

from ..common.device import border_index, saturate_f32
from .plan import WINDOW_RY, WINDOW_TX, WINDOW_TY

TX, TY, RY = WINDOW_TX, WINDOW_TY, WINDOW_RY
ROWS = TY * RY  # output rows per block


@cuda.jit(cache=True)
def correlate_window(img, weights, ay, ax, mode, cval, lo, hi, is_int, out):
    """out (H, W, C) = img correlated with weights (kh, kw), anchor (ay, ax); see module."""
    smem = cuda.shared.array(0, dtype=float32)
    height, width, nch = img.shape[0], img.shape[1], img.shape[2]
    kh, kw = weights.shape
    tile_h, tile_w = ROWS + kh - 1, TX + kw - 1
    pitch = tile_h | 1
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    c = cuda.blockIdx.x % nch
    x0 = (cuda.blockIdx.x // nch) * TX
    y0 = cuda.blockIdx.y * ROWS
    top, left = y0 - ay, x0 - ax

    inside = top >= 0 and left >= 0 and top + tile_h <= height and left + tile_w <= width
    outside = np.float32(cval)
    r = ty
    while r < tile_h:
        yy = top + r if inside else border_index(top + r, height, mode)
        q = tx
        while q < tile_w:
            xx = left + q if inside else border_index(left + q, width, mode)
            if yy < 0 or xx < 0:
                smem[q * pitch + r] = outside
            else:
                smem[q * pitch + r] = np.float32(img[yy, xx, c])
            q += TX
        r += TY
    wbase = tile_w * pitch
    t = ty * TX + tx
    while t < kh * kw:  # weights column-major: column j's kh weights in a row
        i = t // kw
        j = t - i * kw
        smem[wbase + j * kh + i] = weights[i, j]
        t += TX * TY
    cuda.syncthreads()

    x = x0 + tx
    ybase = y0 + ty * RY
    if x >= width or ybase >= height:
        return
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
    for j in range(kw):
        col = (tx + j) * pitch + ty * RY
        wcol = wbase + j * kh
        p0 = smem[col]
        p1 = smem[col + 1]
        p2 = smem[col + 2]
        p3 = smem[col + 3]
        p4 = smem[col + 4]
        p5 = smem[col + 5]
        p6 = smem[col + 6]
        i = 0
        # Four kernel rows a step: the window then shifts once per four rows, not
        # once per row (the shift is seven register moves).
        while i + 4 <= kh:
            at = col + 7 + i
            p7, p8, p9, p10 = smem[at], smem[at + 1], smem[at + 2], smem[at + 3]
            wi = wcol + i
            w0, w1, w2, w3 = smem[wi], smem[wi + 1], smem[wi + 2], smem[wi + 3]
            a0, a1, a2, a3, a4, a5, a6, a7 = _taps(
                w0, p0, p1, p2, p3, p4, p5, p6, p7, a0, a1, a2, a3, a4, a5, a6, a7
            )
            a0, a1, a2, a3, a4, a5, a6, a7 = _taps(
                w1, p1, p2, p3, p4, p5, p6, p7, p8, a0, a1, a2, a3, a4, a5, a6, a7
            )
            a0, a1, a2, a3, a4, a5, a6, a7 = _taps(
                w2, p2, p3, p4, p5, p6, p7, p8, p9, a0, a1, a2, a3, a4, a5, a6, a7
            )
            a0, a1, a2, a3, a4, a5, a6, a7 = _taps(
                w3, p3, p4, p5, p6, p7, p8, p9, p10, a0, a1, a2, a3, a4, a5, a6, a7
            )
            p0, p1, p2, p3, p4, p5, p6 = p4, p5, p6, p7, p8, p9, p10
            i += 4
        while i < kh:
            p7 = smem[col + 7 + i]
            a0, a1, a2, a3, a4, a5, a6, a7 = _taps(
                smem[wcol + i], p0, p1, p2, p3, p4, p5, p6, p7, a0, a1, a2, a3, a4, a5, a6, a7
            )
            p0, p1, p2, p3, p4, p5, p6 = p1, p2, p3, p4, p5, p6, p7
            i += 1
    _store(out, ybase, x, c, a0, is_int, lo, hi)
    if ybase + 1 < height:
        _store(out, ybase + 1, x, c, a1, is_int, lo, hi)
    if ybase + 2 < height:
        _store(out, ybase + 2, x, c, a2, is_int, lo, hi)
    if ybase + 3 < height:
        _store(out, ybase + 3, x, c, a3, is_int, lo, hi)
    if ybase + 4 < height:
        _store(out, ybase + 4, x, c, a4, is_int, lo, hi)
    if ybase + 5 < height:
        _store(out, ybase + 5, x, c, a5, is_int, lo, hi)
    if ybase + 6 < height:
        _store(out, ybase + 6, x, c, a6, is_int, lo, hi)
    if ybase + 7 < height:
        _store(out, ybase + 7, x, c, a7, is_int, lo, hi)


@cuda.jit(device=True, inline=True)
def _taps(w, p0, p1, p2, p3, p4, p5, p6, p7, a0, a1, a2, a3, a4, a5, a6, a7):
    """One kernel row's tap on the eight outputs: a_r + w * p_r, each a fused multiply-add."""
    return (
        cuda.fma(w, p0, a0),
        cuda.fma(w, p1, a1),
        cuda.fma(w, p2, a2),
        cuda.fma(w, p3, a3),
        cuda.fma(w, p4, a4),
        cuda.fma(w, p5, a5),
        cuda.fma(w, p6, a6),
        cuda.fma(w, p7, a7),
    )


@cuda.jit(device=True, inline=True)
def _store(out, y, x, c, acc, is_int, lo, hi):
    if is_int:
        out[y, x, c] = saturate_f32(acc, lo, hi)
    else:
        out[y, x, c] = acc
