"""The box filters that take any image and box: `box_separable` and `box_running`.

Same contract as every box filter (`kernels.box.dispatch`): (H, W, C) device images
of uint8, uint16 or float32, borders by `kernels.common.border_index` code, exact
sums, integer outputs rounded half to even and saturated.
- `box_separable`: a row-sum pass into a scratch image, then a column-sum pass.
  Cost per pixel grows with k.
- `box_running`: running sums. A column pass keeps a running sum down each
  (column, channel) lane (add the entering row, subtract the leaving one) into a
  narrow exact scratch (uint16 for uint8 images), then a row pass slides along
  each row in shared memory. The cost per pixel barely depends on k.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, float64, uint64

from ..common.arrays import empty
from ..common.device import border_index, saturate_int
from ..common.launch import SMEM_LIMIT, cdiv, image_grid, launch, scratch
from ..common.saturate import output_limits

# box_running geometry: the column pass walks STRIP_ROWS rows per thread; the row
# pass gives each block ROW_TILE pixels of a row and each thread RUN of them.
STRIP_ROWS = 128
ROW_TILE = 512
RUN = 16


def _exact_in_float32(dtype, kh: int, kw: int) -> bool:
    """Whether every partial box sum of this image is an integer below 2**24."""
    return np.dtype(dtype) == np.uint8 and kh * kw * 255 < 2**24


# ----------------------------------------------------------------- separable passes


@cuda.jit(cache=True)
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


@cuda.jit(cache=True)
def box_cols(sums, kh, ay, mode, row_cval, area, lo, hi, is_int, out):
    """out = (sum of kh row sums around y) / area, rounded and saturated as filter2D."""
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
    v = acc / area  # a correctly rounded division keeps exact halves exact
    if is_int:
        out[y, x, c] = saturate_int(v, lo, hi)
    else:
        out[y, x, c] = v


def box_separable(img, ksize, anchor, mode, cval, out=None, stream: int = 0):
    """Box filter by a row pass and a column pass through a scratch sum image,
    queued on `stream`."""
    height, width, channels = img.shape
    kh, kw = ksize
    ay, ax = anchor
    lo, hi, is_int = output_limits(img.dtype)
    sum_dtype = np.float32 if _exact_in_float32(img.dtype, kh, kw) else np.float64
    sums = scratch(img.shape, sum_dtype, stream)
    if out is None:
        out = empty(img.shape, img.dtype, stream)
    grid, block = image_grid(height, width, channels)
    launch(box_rows, grid, block, (img, kw, ax, mode, float(cval), sums), stream)
    area = float(kh * kw)
    args = (sums, kh, ay, mode, kw * float(cval), area, lo, hi, is_int, out)
    launch(box_cols, grid, block, args, stream)
    return out


# ------------------------------------------------------------ running sums, two passes


@cuda.jit(device=True)
def _at(img, y, ux, uc, cval):
    """img[y, x, c] for a mapped row y, or the constant border value when y < 0."""
    if y < 0:
        return cval
    return cval - cval + img[uint64(y), ux, uc]


@cuda.jit(cache=True)
def box_column_sums(img, kh, ay, mode, cval, strip, sums):
    """sums[y, x * C + c] = sum of img[y - ay : y - ay + kh, x, c], borders applied.

    One thread per (column, channel) lane walks `strip` rows keeping a running sum:
    after the first row, each row adds the entering input row and subtracts the
    leaving one. Consecutive threads read consecutive bytes. Rows go four at a
    time with all eight loads issued before any is used, so a thread waits for
    memory once per four rows. cval's type sets the accumulator: int64 for integer
    images (exact, no slow int<->float conversions), float64 for float32 images;
    sums' dtype is chosen by the host to hold the sums (uint16 for uint8 input).
    """
    lane = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    height, width, channels = img.shape
    if lane >= width * channels:
        return
    x = lane // channels
    # Unsigned indices where they are known non-negative: Numba wraps negative
    # signed indices at a cost of several instructions per access.
    ux = uint64(x)
    uc = uint64(lane - x * channels)
    ulane = uint64(lane)
    y_begin = cuda.blockIdx.y * strip
    y_end = min(y_begin + strip, height)
    acc = cval - cval
    for i in range(kh):
        acc += _at(img, border_index(y_begin + i - ay, height, mode), ux, uc, cval)
    sums[uint64(y_begin), ulane] = acc
    enter = kh - ay - 1  # row entering at output row y is y + enter
    leave = -ay - 1  # row leaving at output row y is y + leave
    y = y_begin + 1
    while y + 3 < y_end:
        in0 = _at(img, border_index(y + enter, height, mode), ux, uc, cval)
        in1 = _at(img, border_index(y + 1 + enter, height, mode), ux, uc, cval)
        in2 = _at(img, border_index(y + 2 + enter, height, mode), ux, uc, cval)
        in3 = _at(img, border_index(y + 3 + enter, height, mode), ux, uc, cval)
        out0 = _at(img, border_index(y + leave, height, mode), ux, uc, cval)
        out1 = _at(img, border_index(y + 1 + leave, height, mode), ux, uc, cval)
        out2 = _at(img, border_index(y + 2 + leave, height, mode), ux, uc, cval)
        out3 = _at(img, border_index(y + 3 + leave, height, mode), ux, uc, cval)
        acc += in0 - out0
        sums[uint64(y), ulane] = acc
        acc += in1 - out1
        sums[uint64(y + 1), ulane] = acc
        acc += in2 - out2
        sums[uint64(y + 2), ulane] = acc
        acc += in3 - out3
        sums[uint64(y + 3), ulane] = acc
        y += 4
    while y < y_end:
        acc += _at(img, border_index(y + enter, height, mode), ux, uc, cval)
        acc -= _at(img, border_index(y + leave, height, mode), ux, uc, cval)
        sums[uint64(y), ulane] = acc
        y += 1


def _make_box_row_sums(stage_type):
    """Build the row pass that stages column sums in shared memory as `stage_type`."""

    @cuda.jit(cache=True)
    def box_row_sums(
        sums, kw, ax, mode, row_cval, zero, area, lo, hi, is_int, tile_w, channels, out_rows
    ):
        """out[y, x, c] = sum of sums[y, (x - ax + j) * C + c] for j < kw, over area.

        out_rows is the (H, W, C) output viewed as (H, W * C).

        A block owns tile_w output pixels of one row. It stages the tile's column
        sums plus halo in shared memory, then each thread slides RUN outputs of one
        channel along the row (add the entering column, subtract the leaving one),
        stages the rounded results, and the block writes them out coalesced.
        """
        smem = cuda.shared.array(0, dtype=stage_type)
        width = out_rows.shape[1] // channels
        y = cuda.blockIdx.y
        x0 = cuda.blockIdx.x * tile_w
        out_w = min(tile_w, width - x0)
        n_px = out_w + kw - 1
        tid = cuda.threadIdx.x
        nthreads = cuda.blockDim.x
        uy = uint64(y)
        uch = uint64(channels)
        for p in range(tid, n_px, nthreads):
            xx = border_index(x0 - ax + p, width, mode)
            up = uint64(p) * uch
            for c in range(channels):
                if xx < 0:
                    smem[up + uint64(c)] = row_cval
                else:
                    smem[up + uint64(c)] = sums[uy, uint64(xx) * uch + uint64(c)]
        cuda.syncthreads()

        results = uint64(n_px) * uch  # staged results start after the column sums
        c = tid % channels
        xs = (tid // channels) * RUN
        xe = min(xs + RUN, out_w)
        if xs < out_w:
            first = uint64(xs) * uch + uint64(c)  # (xs, c) in the staged sums
            enter = first + uint64(kw) * uch  # the column entering after (xs, c)
            acc = zero
            for j in range(kw):
                acc += smem[first + uint64(j) * uch]
            for x in range(xs, xe):
                if x > xs:
                    acc += smem[enter]
                    acc -= smem[first]
                    enter += uch
                    first += uch
                v = acc / area  # correctly rounded: exact halves stay exact
                if is_int:
                    v = saturate_int(v, lo, hi)
                smem[results + uint64(x) * uch + uint64(c)] = v
        cuda.syncthreads()
        row_base = uint64(x0) * uch
        for i in range(tid, out_w * channels, nthreads):
            out_rows[uy, row_base + uint64(i)] = smem[results + uint64(i)]

    return box_row_sums


_ROW_SUMS = {exact: _make_box_row_sums(float32 if exact else float64) for exact in (True, False)}


def _column_sum_dtype(dtype, kh: int):
    """Narrowest exact dtype for kh-row sums: uint16 for uint8 images, else float64."""
    if np.dtype(dtype) == np.uint8 and kh * 255 <= 65535:
        return np.uint16
    return np.float64


def box_running(img, ksize, anchor, mode, cval, out=None, stream: int = 0):
    """Box filter by running sums: a column pass, then a row pass. Cost ~ independent of k.

    Falls back to `box_separable` when the row tile would not fit shared memory.
    """
    height, width, channels = img.shape
    kh, kw = ksize
    ay, ax = anchor
    exact32 = _exact_in_float32(img.dtype, kh, kw)
    itemsize = 4 if exact32 else 8
    tile_w = ROW_TILE
    smem = ((tile_w + kw - 1) * channels + tile_w * channels) * itemsize
    if smem > SMEM_LIMIT:
        return box_separable(img, ksize, anchor, mode, cval, out, stream)
    lo, hi, is_int = output_limits(img.dtype)
    if out is None:
        out = empty(img.shape, img.dtype, stream)
    sums = scratch((height, width * channels), _column_sum_dtype(img.dtype, kh), stream)
    lanes = width * channels
    col_cval = np.int64(cval) if is_int else np.float64(cval)
    grid = (cdiv(lanes, 128), cdiv(height, STRIP_ROWS))
    launch(box_column_sums, grid, 128, (img, kh, ay, mode, col_cval, STRIP_ROWS, sums), stream)
    stage_type = np.float32 if exact32 else np.float64
    zero = stage_type(0)
    area = stage_type(kh * kw)
    threads = cdiv(tile_w, RUN) * channels
    args = (
        sums,
        kw,
        ax,
        mode,
        kh * float(cval),
        zero,
        area,
        lo,
        hi,
        is_int,
        tile_w,
        channels,
        out.reshape(height, width * channels),
    )
    launch(_ROW_SUMS[exact32], (cdiv(width, tile_w), height), threads, args, stream, smem)
    return out
