"""The CPU backend's compiled loops (`imgfilter.backends.cpu`): Numba `@njit` code,
cached on disk (cache=True), in a module of its own so that calls OpenCV and NumPy
answer alone (every box, small kernels, the separable and FFT paths) never import
Numba: only the direct sums and, used once Numba is loaded, the fused contour pass and
the FFT tiles' recompute (`direct_dense`) are here.
Rounding and the gray conversion are the plain-Python helpers in `kernels`
(`saturate_int`, `bgr_to_gray`), compiled here with `njit`, so CPU and CUDA code share
one source of truth; borders come as index maps (`cpu_common.axis_map`, from the same
`border_index`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from kernels.common import gray as _gray
from kernels.common import saturate as _sat

_CHUNK = 512  # output elements per task of the direct loops (accumulators stay in L1)

saturate_int = njit(inline="always", cache=True)(_sat.saturate_int)
bgr_to_gray = njit(inline="always", cache=True)(_gray.bgr_to_gray)


@njit(inline="always")
def _store_int(acc, lo, hi):
    # Clamp first so that huge (or NaN) accumulators never reach an integer conversion.
    if not acc >= lo:  # NaN too, as OpenCV's saturate_cast gives 0
        return lo
    if acc > hi:
        return hi
    return saturate_int(acc, lo, hi)


@intrinsic
def _fma32(typingctx, a, b, c):
    """a * b + c in float32 with one rounding (llvm.fma), as OpenCV's SIMD v_muladd."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


@njit(inline="always")
def _store_checked(v, bound, lo, hi, is_int):
    """(ok, stored value): `v` rounded as the output dtype rounds it, and whether every
    value within `bound` of `v` rounds (and saturates) the same way."""
    if is_int:
        a = _store_int(v - bound, lo, hi)
        b = _store_int(v + bound, lo, hi)
        return a == b, np.float64(a)
    a = np.float32(v - bound)
    b = np.float32(v + bound)
    return a == b, np.float64(a)


@njit(inline="always")
def _direct_one(flat, base, offs, ws):
    """One output of the direct float64 correlation: taps in order, from 0."""
    s = 0.0
    for t in range(offs.shape[0]):
        s += np.float64(ws[t]) * np.float64(flat[base + offs[t]])
    return s


@njit(parallel=True, cache=True)
def _direct_rows(flat, rowlen, offs, ws, out, lo, hi, is_int, wide, bound):
    """out[y, x] = sum_t ws[t] * flat[y * rowlen + offs[t] + x] (x over W*C).

    The non-zero taps in row-major order, from 0: in float64 (mul, then add) when
    `wide`, else float32 fused multiply-adds. Four taps share a pass over a chunk of
    accumulators (the same operations in the same order as one tap at a time).
    bound >= 0 (float32 only): an output whose value within `bound` does not round
    the same way is recomputed in float64 (`_direct_one`), so the stored value is
    that of the float64 correlation.
    """
    height, wc = out.shape
    ntaps = offs.shape[0]
    nchunks = (wc + _CHUNK - 1) // _CHUNK
    for task in prange(height * nchunks):
        y = task // nchunks
        x0 = (task % nchunks) * _CHUNK
        n = min(_CHUNK, wc - x0)
        base = y * rowlen + x0
        if wide:
            acc = np.zeros(n, np.float64)
            t = 0
            while t + 4 <= ntaps:
                w0 = np.float64(ws[t])
                w1 = np.float64(ws[t + 1])
                w2 = np.float64(ws[t + 2])
                w3 = np.float64(ws[t + 3])
                s0 = flat[base + offs[t] : base + offs[t] + n]
                s1 = flat[base + offs[t + 1] : base + offs[t + 1] + n]
                s2 = flat[base + offs[t + 2] : base + offs[t + 2] + n]
                s3 = flat[base + offs[t + 3] : base + offs[t + 3] + n]
                for x in range(n):
                    a = acc[x] + w0 * np.float64(s0[x])
                    a = a + w1 * np.float64(s1[x])
                    a = a + w2 * np.float64(s2[x])
                    acc[x] = a + w3 * np.float64(s3[x])
                t += 4
            while t < ntaps:
                w0 = np.float64(ws[t])
                s0 = flat[base + offs[t] : base + offs[t] + n]
                for x in range(n):
                    acc[x] = acc[x] + w0 * np.float64(s0[x])
                t += 1
            for x in range(n):
                if is_int:
                    out[y, x0 + x] = _store_int(acc[x], lo, hi)
                else:
                    out[y, x0 + x] = np.float32(acc[x])
        else:
            acc32 = np.zeros(n, np.float32)
            t = 0
            while t + 4 <= ntaps:
                w0 = ws[t]
                w1 = ws[t + 1]
                w2 = ws[t + 2]
                w3 = ws[t + 3]
                s0 = flat[base + offs[t] : base + offs[t] + n]
                s1 = flat[base + offs[t + 1] : base + offs[t + 1] + n]
                s2 = flat[base + offs[t + 2] : base + offs[t + 2] + n]
                s3 = flat[base + offs[t + 3] : base + offs[t + 3] + n]
                for x in range(n):
                    a = _fma32(w0, s0[x], acc32[x])
                    a = _fma32(w1, s1[x], a)
                    a = _fma32(w2, s2[x], a)
                    acc32[x] = _fma32(w3, s3[x], a)
                t += 4
            while t < ntaps:
                w0 = ws[t]
                s0 = flat[base + offs[t] : base + offs[t] + n]
                for x in range(n):
                    acc32[x] = _fma32(w0, s0[x], acc32[x])
                t += 1
            for x in range(n):
                v = np.float64(acc32[x])
                if bound >= 0:
                    ok, r = _store_checked(v, bound, lo, hi, is_int)
                    if not ok:
                        v = _direct_one(flat, base + x, offs, ws)
                if is_int:
                    out[y, x0 + x] = _store_int(v, lo, hi)
                else:
                    out[y, x0 + x] = np.float32(v)


@njit(parallel=True, cache=True)
def _gray_padded(img, rows, cols, cval, out):
    """out[py, px] = gray of img at (rows[py], cols[px]); cval where either is -1."""
    nch = img.shape[2]
    for py in prange(rows.shape[0]):
        yy = rows[py]
        for px in range(cols.shape[0]):
            xx = cols[px]
            if yy < 0 or xx < 0:
                out[py, px] = cval
            elif nch == 1:
                out[py, px] = img[yy, xx, 0]
            else:
                b = np.int64(img[yy, xx, 0])
                g = np.int64(img[yy, xx, 1])
                r = np.int64(img[yy, xx, 2])
                out[py, px] = bgr_to_gray(b, g, r)


@njit(inline="always")
def _clip(v, hi):
    if v < 0:
        return 0
    return v if v < hi else hi


@njit(parallel=True, cache=True)
def _contour_rows(g, hi, out):
    """The four 3x3 responses of the padded gray image g, each clipped, OR-ed."""
    height, width = out.shape
    for y in prange(height):
        top = g[y]
        mid = g[y + 1]
        bot = g[y + 2]
        for x in range(width):
            gx = (top[x + 2] + mid[x + 2] + bot[x + 2]) - (top[x] + mid[x] + bot[x])
            gy = (bot[x] + bot[x + 1] + bot[x + 2]) - (top[x] + top[x + 1] + top[x + 2])
            out[y, x] = _clip(gx, hi) | _clip(-gx, hi) | _clip(gy, hi) | _clip(-gy, hi)


@njit(nogil=True, cache=True, fastmath={"contract"})
def direct_dense(flat, bases, rowlen, k64, acc):
    """acc[p] = the direct float64 sum of the output whose window starts at flat
    offset bases[p] (rows of `rowlen` values, one channel): k64[i, j] * flat[bases[p]
    + i * rowlen + j] over i, then j, in order, from 0: `cpu_common.direct_sums`,
    compiled (the FFT tiles' recompute in a process that has loaded Numba).

    Zero taps are included: for finite pixels each adds a zero to a sum that is never
    -0 (it starts at +0), so the sums equal those over the non-zero taps alone. Every
    product of a float32 weight and a pixel (float32, uint8 or uint16) is exact in
    float64, so the fused multiply-adds the compiler may form give the same sums as
    multiply-then-add. Eight outputs share each pass over a kernel row (eight
    independent chains over contiguous runs)."""
    kh, kw = k64.shape
    m = bases.shape[0]
    p = 0
    while p + 8 <= m:
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        for i in range(kh):
            k = k64[i]
            r = i * rowlen
            s0 = flat[bases[p] + r : bases[p] + r + kw]
            s1 = flat[bases[p + 1] + r : bases[p + 1] + r + kw]
            s2 = flat[bases[p + 2] + r : bases[p + 2] + r + kw]
            s3 = flat[bases[p + 3] + r : bases[p + 3] + r + kw]
            s4 = flat[bases[p + 4] + r : bases[p + 4] + r + kw]
            s5 = flat[bases[p + 5] + r : bases[p + 5] + r + kw]
            s6 = flat[bases[p + 6] + r : bases[p + 6] + r + kw]
            s7 = flat[bases[p + 7] + r : bases[p + 7] + r + kw]
            for j in range(kw):
                w = k[j]
                a0 += w * np.float64(s0[j])
                a1 += w * np.float64(s1[j])
                a2 += w * np.float64(s2[j])
                a3 += w * np.float64(s3[j])
                a4 += w * np.float64(s4[j])
                a5 += w * np.float64(s5[j])
                a6 += w * np.float64(s6[j])
                a7 += w * np.float64(s7[j])
        acc[p], acc[p + 1], acc[p + 2], acc[p + 3] = a0, a1, a2, a3
        acc[p + 4], acc[p + 5], acc[p + 6], acc[p + 7] = a4, a5, a6, a7
        p += 8
    while p < m:
        a0 = 0.0
        for i in range(kh):
            for j in range(kw):
                a0 += k64[i, j] * np.float64(flat[bases[p] + i * rowlen + j])
        acc[p] = a0
        p += 1
