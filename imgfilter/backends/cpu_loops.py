"""The CPU backend's compiled loops (`imgfilter.backends.cpu`): Numba `@njit` code,
in a module of its own so that calls OpenCV answers alone (uint8 blur, small
kernels) never import Numba. `imgfilter.backends.cpu` imports it on first need.
Rounding and the gray conversion are the plain-Python helpers in `kernels`
(`saturate_int`, `bgr_to_gray`), compiled here with `njit`, so CPU and CUDA code share
one source of truth; borders come as index maps (`cpu._axis_map`, from the same
`border_index`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from kernels.common import gray as _gray
from kernels.common import saturate as _sat

from .cpu import _BOX_CHUNK, _BOX_COPY, _BOX_F32, _BOX_FIXED, _CHUNK, _FIXED_SHIFT

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


@njit(parallel=True, cache=True)
def _pad_into(src, nch, rows, cols, left, value, out):
    """out (Hp, Wp*C) = src (H, W*C) extended by the index maps rows/cols (-1: value).

    Columns left .. left + W - 1 of out are src's columns 0 .. W - 1 (a plain copy,
    converted to out's dtype); the others go through `cols`.
    """
    wc = src.shape[1]
    for py in prange(rows.shape[0]):
        sy = rows[py]
        o = out[py]
        if sy < 0:
            for q in range(o.shape[0]):
                o[q] = value
            continue
        s = src[sy]
        for q in range(wc):
            o[left * nch + q] = s[q]
        for px in range(cols.shape[0]):
            if px == left:
                continue
            if left <= px < left + wc // nch:
                continue
            sx = cols[px]
            for c in range(nch):
                o[px * nch + c] = value if sx < 0 else s[sx * nch + c]


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
def _separable_rows(pad, nch, u, v, out, lo, hi, is_int, bound, flat, offs, ws):
    """out[y] = sum_r (row pass v[r] of (column pass u[r] of pad rows y ..)), in float64.

    bound >= 0: outputs whose value within `bound` does not round the same way are
    recomputed by the direct float64 correlation (`_direct_one`); bound < 0: stored
    as computed (float32 outputs).
    """
    height, wc = out.shape
    rank, kh = u.shape
    kw = v.shape[1]
    wpc = pad.shape[1]
    for y in prange(height):
        col = np.empty(wpc, np.float64)
        acc = np.zeros(wc, np.float64)
        for r in range(rank):
            u0 = u[r, 0]
            src = pad[y]
            for x in range(wpc):
                col[x] = u0 * np.float64(src[x])
            for i in range(1, kh):
                ui = u[r, i]
                src = pad[y + i]
                for x in range(wpc):
                    col[x] += ui * np.float64(src[x])
            for j in range(kw):
                vj = v[r, j]
                c = col[j * nch : j * nch + wc]
                for x in range(wc):
                    acc[x] += vj * c[x]
        for x in range(wc):
            s = acc[x]
            if bound >= 0:
                ok, q = _store_checked(s, bound, lo, hi, is_int)
                if not ok:
                    s = _direct_one(flat, y * wpc + x, offs, ws)
            if is_int:
                out[y, x] = _store_int(s, lo, hi)
            else:
                out[y, x] = np.float32(s)


@njit(inline="always")
def _box_value(s, mode, delta, mul, scale32, scale64, lo, hi):
    if mode == _BOX_COPY:
        return s
    if mode == _BOX_FIXED:
        q = ((np.int64(s) + delta) * mul) >> _FIXED_SHIFT
        return q if q < hi else hi
    if mode == _BOX_F32:
        return _store_int(np.float32(s) * scale32, lo, hi)
    return _store_int(s * scale64, lo, hi)


@njit(parallel=True, cache=True)
def _box_scale(sums, out, mode, delta, mul, scale32, scale64, lo, hi):
    """out = OpenCV's scaling (`box_scaling`) of exact box sums (int32 or float64)."""
    for y in prange(out.shape[0]):
        s = sums[y]
        o = out[y]
        for x in range(o.shape[0]):
            o[x] = _box_value(s[x], mode, delta, mul, scale32, scale64, lo, hi)


@njit(inline="always")
def _load_row(img, sy, value, dst):
    """dst (W * C, float64) = row sy of the (H, W, C) image, or `value` when sy is -1."""
    if sy < 0:
        dst[:] = value
        return
    src = img[sy].reshape(-1)
    for x in range(dst.shape[0]):
        dst[x] = src[x]


@njit(inline="always")
def _suffix_rows(s):
    """s[i] = s[i] + s[i + 1] + ... + s[-1] (rows of s, in place, from the last)."""
    for i in range(s.shape[0] - 2, -1, -1):
        a = s[i]
        b = s[i + 1]
        for x in range(a.shape[0]):
            a[x] += b[x]


@njit(inline="always")
def _prefix_step(row, p, s_i, v):
    """p += row (the next block's prefix sum), v = s_i + p (a box's column sums)."""
    for x in range(row.shape[0]):
        p[x] += row[x]
        v[x] = s_i[x] + p[x]


@njit(inline="always")
def _add_shifted(dst, src, first, count, step, n):
    """dst[:n] += src[first + j * step : ... + n] for j in 0 .. count - 1, in order
    (four per pass)."""
    j = 0
    while j + 4 <= count:
        o = first + j * step
        s0 = src[o : o + n]
        s1 = src[o + step : o + step + n]
        s2 = src[o + 2 * step : o + 2 * step + n]
        s3 = src[o + 3 * step : o + 3 * step + n]
        for x in range(n):
            dst[x] = (((dst[x] + s0[x]) + s1[x]) + s2[x]) + s3[x]
        j += 4
    while j < count:
        o = first + j * step
        s0 = src[o : o + n]
        for x in range(n):
            dst[x] += s0[x]
        j += 1


@njit(inline="always")
def _box_row(pad, cols, left, cvalue, kw, g, nch, grp, acc, scale, out):
    """out (W * C) = float32(scale * sums of kw padded pixels) of the padded row of
    column sums `pad` ((W + kw - 1) * C, float64), whose columns left .. left + W - 1
    are filled; the others are filled here from the column map `cols` (-1: cvalue).

    Per chunk of `_BOX_CHUNK` outputs: sums of g consecutive pixels (grp), then each
    box as kw // g of them plus its kw % g last pixels: about g + kw / g adds per
    output instead of kw, and every partial sum holds only pixels of its box."""
    wc = out.shape[0]
    w = wc // nch
    for px in range(left):
        sx = cols[px]
        for c in range(nch):
            pad[px * nch + c] = cvalue if sx < 0 else pad[(left + sx) * nch + c]
    for px in range(left + w, cols.shape[0]):
        sx = cols[px]
        for c in range(nch):
            pad[px * nch + c] = cvalue if sx < 0 else pad[(left + sx) * nch + c]
    q = kw // g
    for x0 in range(0, wc, _BOX_CHUNK):
        n = min(_BOX_CHUNK, wc - x0)
        m = n + (q - 1) * g * nch
        gs = grp[:m]
        gs[:] = pad[x0 : x0 + m]
        _add_shifted(gs, pad, x0 + nch, g - 1, nch, m)
        a = acc[:n]
        a[:] = gs[:n]
        _add_shifted(a, gs, g * nch, q - 1, g * nch, n)
        _add_shifted(a, pad, x0 + q * g * nch, kw - q * g, nch, n)
        o = out[x0 : x0 + n]
        for x in range(n):
            o[x] = a[x] * scale


@njit(parallel=True, cache=True)
def _box_float_bands(img, rows, cols, left, value, kh, kw, g, out, scale, nbands):
    """float32 boxes: out (H, W * C) = float32(scale * box sum), float64 sums that
    never subtract, so a huge, inf or NaN pixel reaches only the boxes that hold it.

    Padded row p is image row rows[p] (-1: `value`); padded column px is image column
    cols[px] (-1: `value`), image column 0 at padded column `left`. Column sums (van
    Herk / Gil-Werman): each of `nbands` bands of output rows, from its first row y0,
    cuts the padded rows into blocks of kh; the column sum of a box from row y is the
    suffix sum of its block from y (s) plus, unless y starts a block, the prefix sum
    of the next block up to y + kh - 1 (p): partial sums of the box's own pixels. Row
    sums: groups of g column sums (`_box_row`)."""
    h, w, nch = img.shape
    wc = w * nch
    off = left * nch
    band = -(-h // nbands)
    for bi in prange(nbands):
        y0 = bi * band
        y1 = min(h, y0 + band)
        if y0 >= y1:
            continue
        s = np.empty((kh, wc))
        nxt = np.empty((kh, wc))
        p = np.empty(wc)
        pad = np.empty(cols.shape[0] * nch)
        acc = np.empty(_BOX_CHUNK)
        grp = np.empty(_BOX_CHUNK + kw * nch)
        v = pad[off : off + wc]
        for i in range(kh):
            _load_row(img, rows[y0 + i], value, s[i])
        _suffix_rows(s)
        b0 = y0
        while b0 < y1:
            v[:] = s[0]
            _box_row(pad, cols, left, kh * value, kw, g, nch, grp, acc, scale, out[b0])
            p[:] = 0.0
            for i in range(1, min(kh, y1 - b0)):
                _load_row(img, rows[b0 + kh + i - 1], value, nxt[i - 1])
                _prefix_step(nxt[i - 1], p, s[i], v)
                _box_row(pad, cols, left, kh * value, kw, g, nch, grp, acc, scale, out[b0 + i])
            b0 += kh
            if b0 >= y1:
                break
            _load_row(img, rows[b0 + kh - 1], value, nxt[kh - 1])
            _suffix_rows(nxt)
            s, nxt = nxt, s


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
