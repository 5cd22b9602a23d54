"""The CPU backend: Numba `@njit(parallel=True)` loops, rows spread over the cores.

Host arrays only. See `imgfilter.backends` for the contract shared with the CUDA
backend. Border handling, rounding and the gray conversion are the plain-Python
helpers in `kernels` (`border_index`, `saturate_int`, `bgr_to_gray`), compiled here
with `njit`, so CPU and CUDA code share one source of truth.

How each filter rounds, and how that compares with OpenCV:
- correlate: the image is padded on the host (index maps from `border_index`), then
  each output row accumulates its taps in row-major order, zero taps skipped, from 0,
  as cv2.filter2D's direct path does: in float32 with fused multiply-adds (OpenCV's
  SIMD body) below `direct_area_limit` taps, in float64 from there (where OpenCV 5's
  uint16 and float32 results equal a float64 correlation). Integer outputs through
  `saturate_int` (round half to even, clamp). Measured against cv2.filter2D on random
  data: integer kernels bit-exact; float kernels bit-exact for uint16, and for uint8
  below 130 taps (from 130 OpenCV correlates uint8 by DFT: rare 1 LSB differences);
  float32 bit-exact except in OpenCV's scalar tails (a few elements per row, computed
  without FMA: last-bit differences).
- box: exact sums (float64 registers hold every integer box sum exactly; running
  sums for integer images, direct sums for float32 so that huge values do not leak
  into their neighbours), then OpenCV's own scaling, see `box_scaling`: bit-exact with
  cv2.blur for uint8 boxes of up to 256 pixels, and elsewhere equal to the SIMD body
  of OpenCV's column filter (its scalar tail, a few pixels per row, rounds in double
  and can differ by 1 LSB at near-ties).
- contour: gray as cv2.cvtColor (`bgr_to_gray`), four integer responses, saturated,
  OR-ed: bit-exact.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from kernels import border_index as _bi
from kernels import gray as _gray
from kernels import saturate as _sat
from kernels.saturate import output_limits

NAME = "cpu"

border_index = njit(inline="always", cache=True)(_bi.border_index)
saturate_int = njit(inline="always", cache=True)(_sat.saturate_int)
bgr_to_gray = njit(inline="always", cache=True)(_gray.bgr_to_gray)

# box scaling modes (see box_scaling)
_BOX_FLOAT = 0  # float32 image: float32(sum * (1.0 / area)), sum and scale in double
_BOX_COPY = 1  # area 1: the sum itself
_BOX_FIXED = 2  # uint8, area <= 256: ((sum + delta) * mul) >> 23, OpenCV's fixed point
_BOX_F32 = 3  # int sums: round(float32(sum) * float32(1 / area))
_BOX_F64 = 4  # double sums (huge boxes): round(sum * (1.0 / area))
_FIXED_SHIFT = 23


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
        return _BOX_FLOAT, 0, 0
    if area == 1:
        return _BOX_COPY, 0, 0
    if dt == np.uint8 and area <= 256:
        scalef = float(1 << _FIXED_SHIFT) / area
        mul = math.floor(scalef)
        delta = area // 2
        if scalef - mul < 0.5:
            delta += 1
        else:
            mul += 1
        return _BOX_FIXED, delta, mul
    if area > (1 << 23 if dt == np.uint8 else 1 << 15):
        return _BOX_F64, 0, 0
    return _BOX_F32, 0, 0


@njit(cache=True)
def _axis_map(n, before, after, mode):
    """Source index for each of before + n + after positions; -1 is the constant border."""
    out = np.empty(before + n + after, np.int64)
    for p in range(out.shape[0]):
        out[p] = border_index(p - before, n, mode)
    return out


def _pad(img: np.ndarray, top: int, bottom: int, left: int, right: int, mode: int, value):
    """(H, W, C) -> (H + top + bottom, W + left + right, C), borders by `mode`."""
    rows = _axis_map(img.shape[0], top, bottom, mode)
    cols = _axis_map(img.shape[1], left, right, mode)
    out = img.take(np.maximum(rows, 0), axis=0).take(np.maximum(cols, 0), axis=1)
    if mode == _bi.CONSTANT and (top or bottom or left or right):
        out[rows < 0] = value
        out[:, cols < 0] = value
    return out


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


def direct_area_limit(dtype) -> int:
    """Kernel area from which cv2.filter2D stops using its float32 direct path.

    Below it OpenCV accumulates taps in row-major order with fused multiply-adds in
    float32 (the SIMD body). From it, OpenCV 5's results equal a float64 correlation
    for uint16 and float32 images (checked on random data), and come from a DFT for
    uint8 (close to the float64 result, not always equal). The limits are OpenCV's
    DFT switch-over: 130 taps for uint8 and float32, 50 for uint16.
    """
    return 50 if np.dtype(dtype) == np.uint16 else 130


@njit(parallel=True, cache=True)
def _correlate_rows(pad, nch, weights, out, lo, hi, is_int, wide):
    """out[y, x*C + c] = sum_ij weights[i, j] * pad[y + i, (x + j)*C + c].

    Taps in row-major order, zero taps skipped, from 0: float32 fused multiply-adds,
    or float64 when `wide`.
    """
    height, width = out.shape
    kh, kw = weights.shape
    for y in prange(height):
        acc = np.zeros(width, np.float32)
        acc64 = np.zeros(width if wide else 0, np.float64)
        for i in range(kh):
            src = pad[y + i]
            for j in range(kw):
                w = weights[i, j]
                if w == 0:
                    continue
                off = j * nch
                if wide:
                    w64 = np.float64(w)
                    for x in range(width):
                        acc64[x] += w64 * np.float64(src[off + x])
                else:
                    for x in range(width):
                        acc[x] = _fma32(w, np.float32(src[off + x]), acc[x])
        for x in range(width):
            v = acc64[x] if wide else np.float64(acc[x])
            if is_int:
                out[y, x] = _store_int(v, lo, hi)
            else:
                out[y, x] = np.float32(v)


def correlate(img, kernel, anchor, border, value, method, out=None, stream=None):
    """cv2.filter2D semantics; `method` and `stream` are ignored (one implementation,
    no GPU); the result is written into `out` when given."""
    h, w, c = img.shape
    kh, kw = kernel.shape
    ay, ax = anchor
    pad = _pad(img, ay, kh - 1 - ay, ax, kw - 1 - ax, border, value)
    out = np.empty_like(img) if out is None else out
    lo, hi, is_int = output_limits(img.dtype)
    weights = np.ascontiguousarray(kernel, dtype=np.float32)
    wide = kh * kw >= direct_area_limit(img.dtype)
    _correlate_rows(
        pad.reshape(pad.shape[0], -1), c, weights, out.reshape(h, w * c), lo, hi, is_int, wide
    )
    return out


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
def _box_rows(pad, nch, kh, kw, out, nchunks, mode, delta, mul, scale32, scale64, lo, hi):
    """Box sums of pad (Hp, Wp*C) into out (H, W*C), scaled as `mode` says.

    Row chunks run in parallel. Integer images: running sums down the chunk and along
    each row (exact in float64). float32 images: direct sums, in float64.
    """
    height, wc = out.shape
    width = wc // nch
    running = mode != _BOX_FLOAT
    for chunk in prange(nchunks):
        y0 = chunk * height // nchunks
        y1 = (chunk + 1) * height // nchunks
        colsum = np.zeros(pad.shape[1], np.float64)
        for y in range(y0, y1):
            if running and y > y0:
                enter = pad[y + kh - 1]
                leave = pad[y - 1]
                for x in range(colsum.shape[0]):
                    colsum[x] += np.float64(enter[x]) - np.float64(leave[x])
            else:
                colsum[:] = 0.0
                for i in range(kh):
                    src = pad[y + i]
                    for x in range(colsum.shape[0]):
                        colsum[x] += src[x]
            for c in range(nch):
                s = 0.0
                for j in range(kw):
                    s += colsum[j * nch + c]
                for x in range(width):
                    if x > 0:
                        if running:
                            s += colsum[(x + kw - 1) * nch + c] - colsum[(x - 1) * nch + c]
                        else:
                            s = 0.0
                            for j in range(kw):
                                s += colsum[(x + j) * nch + c]
                    if mode == _BOX_FLOAT:
                        out[y, x * nch + c] = s * scale64
                    else:
                        out[y, x * nch + c] = _box_value(
                            s, mode, delta, mul, scale32, scale64, lo, hi
                        )


def box(img, ksize, anchor, border, value, method, out=None, stream=None):
    """cv2.blur semantics (exact sums, OpenCV's scaling); `method` and `stream` are
    ignored; the result is written into `out` when given."""
    h, w, c = img.shape
    kh, kw = ksize
    ay, ax = anchor
    pad = _pad(img, ay, kh - 1 - ay, ax, kw - 1 - ax, border, value)
    out = np.empty_like(img) if out is None else out
    lo, hi, _ = output_limits(img.dtype)
    area = kh * kw
    mode, delta, mul = box_scaling(img.dtype, area)
    nchunks = min(h, 4 * numba.get_num_threads())
    _box_rows(
        pad.reshape(pad.shape[0], -1),
        c,
        kh,
        kw,
        out.reshape(h, w * c),
        nchunks,
        mode,
        delta,
        mul,
        np.float32(1.0 / area),
        1.0 / area,
        lo,
        hi,
    )
    return out


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


def contour(img, border, value, method, out=None, stream=None):
    """Gray (cv2.cvtColor), four 3x3 edge responses, saturated, OR-ed; (H, W) out
    (written into `out` when given; `stream` is ignored)."""
    h, w, _ = img.shape
    _, hi, _ = output_limits(img.dtype)
    rows = _axis_map(h, 1, 1, border)
    cols = _axis_map(w, 1, 1, border)
    gray = np.empty((h + 2, w + 2), np.int64)
    _gray_padded(img, rows, cols, int(value), gray)
    out = np.empty((h, w), img.dtype) if out is None else out
    _contour_rows(gray, hi, out)
    return out
