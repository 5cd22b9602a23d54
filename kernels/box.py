"""Normalized box filters (cv2.blur semantics) in Numba CUDA.

Images are (H, W, C) device arrays of uint8, uint16 or float32; the output has the
input's dtype. out[y, x, c] = scale * sum of the kh x kw box whose anchor (ay, ax)
sits on (y, x), borders by `kernels.border_index` code, `cval` the constant-border
value (already cast to the image's dtype). Integer outputs are rounded half to even
and saturated. Sums are exact for integer images (float64 registers, stored as
float32 only where that is exact), so only the final scaling rounds; that is why
these agree with cv2.blur bit for bit on uint8 images.

Two implementations:
- `box_separable`: a row-sum pass into a scratch image, then a column-sum pass.
  Cost per pixel grows with k.
- `box_sliding`: one fused pass. A block owns a tile of columns (plus halo) and a
  strip of rows; each thread keeps running column sums for its lanes in registers
  (add the entering row, subtract the leaving one), stages a few rows of column sums
  in shared memory, then threads slide along the row (add the entering column
  sum, subtract the leaving one). Each input byte is read about once; the cost per
  pixel does not depend on k.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, float64

from . import border_index as _bi
from . import saturate as _sat
from .launch import SMEM_LIMIT, cdiv, image_grid

border_index = cuda.jit(device=True)(_bi.border_index)
saturate_int = cuda.jit(device=True)(_sat.saturate_int)

# box_sliding geometry: THREADS threads per block, each owning up to LANES_PER_THREAD
# lanes (one lane = one channel of one column of the tile plus halo); RUN consecutive
# outputs computed by one thread in the row pass; as many rows of column sums staged
# in shared memory per barrier pair as the threads can finish in one row pass.
THREADS = 256
LANES_PER_THREAD = (2, 8)  # compiled variants: few lanes keep registers low
RUN = 32
STRIP_ROWS = 64


def _limits(dtype) -> tuple[int, int, bool]:
    dt = np.dtype(dtype)
    if dt.kind == "u":
        info = np.iinfo(dt)
        return int(info.min), int(info.max), True
    return 0, 0, False


def _exact_in_float32(dtype, kh: int, kw: int) -> bool:
    """Whether every partial box sum of this image is an integer below 2**24."""
    return np.dtype(dtype) == np.uint8 and kh * kw * 255 < 2**24


# ----------------------------------------------------------------- separable passes


@cuda.jit
def box_rows(img, kw, ax, mode, cval, sums):
    """sums[y, x, c] = sum of img[y, x - ax : x - ax + kw, c] with borders applied."""
    x, y = cuda.grid(2)
    c = cuda.blockIdx.z
    height, width = img.shape[0], img.shape[1]
    if y >= height or x >= width:
        return
    acc = 0.0  # float64 in registers: exact for any integer image
    for j in range(kw):
        xx = border_index(x + j - ax, width, mode)
        if xx < 0:
            acc += cval
        else:
            acc += img[y, xx, c]
    sums[y, x, c] = acc


@cuda.jit
def box_cols(sums, kh, ay, mode, row_cval, scale, lo, hi, is_int, out):
    """out = scale * (sum of kh row sums around y), rounded and saturated as filter2D."""
    x, y = cuda.grid(2)
    c = cuda.blockIdx.z
    height, width = sums.shape[0], sums.shape[1]
    if y >= height or x >= width:
        return
    acc = 0.0
    for i in range(kh):
        yy = border_index(y + i - ay, height, mode)
        if yy < 0:
            acc += row_cval
        else:
            acc += sums[yy, x, c]
    v = acc * scale
    if is_int:
        out[y, x, c] = saturate_int(v, lo, hi)
    else:
        out[y, x, c] = v


def box_separable(img, ksize, anchor, mode, cval, out=None):
    """Box filter by a row pass and a column pass through a scratch sum image."""
    height, width, channels = img.shape
    kh, kw = ksize
    ay, ax = anchor
    lo, hi, is_int = _limits(img.dtype)
    sum_dtype = np.float32 if _exact_in_float32(img.dtype, kh, kw) else np.float64
    sums = cuda.device_array(img.shape, dtype=sum_dtype)
    if out is None:
        out = cuda.device_array(img.shape, dtype=img.dtype)
    grid, block = image_grid(height, width, channels)
    box_rows[grid, block](img, kw, ax, mode, float(cval), sums)
    scale = 1.0 / (kh * kw)
    box_cols[grid, block](sums, kh, ay, mode, kw * float(cval), scale, lo, hi, is_int, out)
    return out


# ------------------------------------------------------------------ sliding, fused


def _make_box_sliding(stage_type, lanes_per_thread):
    """Build the fused sliding-sum kernel: sums kept and staged as `stage_type`."""

    @cuda.jit
    def box_sliding(
        img, kh, kw, ay, ax, mode, cval, zero, scale, lo, hi, is_int, tile_w, rows_per_pass, out
    ):
        stage = cuda.shared.array(0, dtype=stage_type)
        height, width, channels = img.shape
        tid = cuda.threadIdx.x
        nthreads = cuda.blockDim.x
        x0 = cuda.blockIdx.x * tile_w  # first output column of this tile
        out_w = min(tile_w, width - x0)
        lanes = (out_w + kw - 1) * channels
        y_begin = cuda.blockIdx.y * STRIP_ROWS
        y_end = min(y_begin + STRIP_ROWS, height)

        # Column pass: thread owns lanes tid, tid + nthreads, ... (lane = tile column
        # including halo, times channels + channel). Divisions happen here only.
        colsum = cuda.local.array(lanes_per_thread, dtype=stage_type)
        src_x = cuda.local.array(lanes_per_thread, dtype=np.int32)
        src_c = cuda.local.array(lanes_per_thread, dtype=np.int32)
        for m in range(lanes_per_thread):
            lane = tid + m * nthreads
            colsum[m] = zero
            src_x[m] = -1
            src_c[m] = 0
            if lane < lanes:
                src_x[m] = border_index(x0 - ax + lane // channels, width, mode)
                src_c[m] = lane % channels

        # Row pass: thread computes RUN consecutive outputs of one channel of row my_r
        # of each pass (host guarantees pairs <= nthreads).
        n_seg = (out_w + RUN - 1) // RUN
        pairs = n_seg * channels
        my_r = tid // pairs
        my_c = tid % channels
        xs = ((tid % pairs) // channels) * RUN
        xe = min(xs + RUN, out_w)

        # Column sums for the row above the strip's first output row, so that every
        # row below is one "add entering row, subtract leaving row" step.
        for i in range(kh):
            yy = border_index(y_begin - 1 + i - ay, height, mode)
            for m in range(lanes_per_thread):
                if tid + m * nthreads < lanes:
                    if yy < 0 or src_x[m] < 0:
                        colsum[m] += cval
                    else:
                        colsum[m] += img[yy, src_x[m], src_c[m]]

        for y_pass in range(y_begin, y_end, rows_per_pass):
            rows = min(rows_per_pass, y_end - y_pass)
            for r in range(rows):
                y = y_pass + r
                y_in = border_index(y - 1 + kh - ay, height, mode)
                y_out = border_index(y - 1 - ay, height, mode)
                for m in range(lanes_per_thread):
                    lane = tid + m * nthreads
                    if lane < lanes:
                        sx = src_x[m]
                        c = src_c[m]
                        v_in = cval if (y_in < 0 or sx < 0) else img[y_in, sx, c]
                        v_out = cval if (y_out < 0 or sx < 0) else img[y_out, sx, c]
                        colsum[m] += v_in
                        colsum[m] -= v_out
                        stage[r * lanes + lane] = colsum[m]
            cuda.syncthreads()
            if my_r < rows:
                base = my_r * lanes + my_c
                acc = zero
                for j in range(kw):
                    acc += stage[base + (xs + j) * channels]
                for x in range(xs, xe):
                    if x > xs:
                        acc += stage[base + (x + kw - 1) * channels]
                        acc -= stage[base + (x - 1) * channels]
                    v = acc * scale
                    if is_int:
                        out[y_pass + my_r, x0 + x, my_c] = saturate_int(v, lo, hi)
                    else:
                        out[y_pass + my_r, x0 + x, my_c] = v
            cuda.syncthreads()

    return box_sliding


_SLIDING = {
    (exact, lpt): _make_box_sliding(float32 if exact else float64, lpt)
    for exact in (True, False)
    for lpt in LANES_PER_THREAD
}


def sliding_tile_width(kw: int, channels: int, lanes_per_thread: int) -> int:
    """Output columns per block so that the tile plus halo fits the lanes (may be <= 0)."""
    return (THREADS * lanes_per_thread) // channels - (kw - 1)


def box_sliding(img, ksize, anchor, mode, cval, out=None):
    """Fused sliding-sum box filter; falls back to the separable passes for huge kw."""
    height, width, channels = img.shape
    kh, kw = ksize
    lpt = next((n for n in LANES_PER_THREAD if sliding_tile_width(kw, channels, n) >= 32), 0)
    if not lpt:
        return box_separable(img, ksize, anchor, mode, cval, out)
    tile_w = min(sliding_tile_width(kw, channels, lpt), 128)
    ay, ax = anchor
    lo, hi, is_int = _limits(img.dtype)
    exact32 = _exact_in_float32(img.dtype, kh, kw)
    itemsize = 4 if exact32 else 8
    lanes = (tile_w + kw - 1) * channels
    rows_per_pass = min(THREADS // (cdiv(tile_w, RUN) * channels), SMEM_LIMIT // (lanes * itemsize))
    if out is None:
        out = cuda.device_array(img.shape, dtype=img.dtype)
    smem = rows_per_pass * lanes * itemsize
    grid = (cdiv(width, tile_w), cdiv(height, STRIP_ROWS))
    zero = np.float32(0) if exact32 else np.float64(0)
    scale = 1.0 / (kh * kw)
    _SLIDING[exact32, lpt][grid, THREADS, 0, smem](
        img,
        kh,
        kw,
        ay,
        ax,
        mode,
        float(cval),
        zero,
        scale,
        lo,
        hi,
        is_int,
        tile_w,
        rows_per_pass,
        out,
    )
    return out
