"""Normalized box filters (cv2.blur semantics) in Numba CUDA.

Images are (H, W, C) device arrays of uint8, uint16 or float32; the output has the
input's dtype. out[y, x, c] = (sum of the kh x kw box whose anchor (ay, ax) sits on
(y, x)) / (kh * kw), borders by `kernels.border_index` code, `cval` the
constant-border value (already cast to the image's dtype). Integer outputs are
rounded half to even and saturated. Sums are exact for integer images (integer or
float64 registers, stored narrower only where that is exact) and the division is
correctly rounded, so the result is round(sum / area) exactly. cv2.blur equals that
except where its 8-bit fixed-point path for boxes of at most 257 pixels rounds
differently (it is off by one at some ties, e.g. a 2x1 box of zeros gives 1).

Six implementations, and `box_auto` choosing among them (`box_method`, which asks
`kernels.box_plan.choose`):
- `box_tiled` (module `kernels.box_tiled`): uint8 images, one shared-memory tile per
  block in three phases (load the tile and halo, horizontal row sums, vertical sums
  written out). The fastest measured for boxes up to `kernels.box_plan.TILED_MAX_BOX`
  (31) on a side; `box_auto` uses it there wherever its tile holds the box and the
  image starts on a 4-byte boundary (`box_choice`).
- `box_twopass` (module `kernels.box_twopass`): uint8 images, a row pass of sliding
  sums into a 16-bit scratch, then a column pass of running sums and means. `box_auto`
  uses it for larger uint8 boxes up to 257 columns (faster than box_fused there on
  the H100) where the image starts on a 4-byte boundary.
- `box_fused` (module `kernels.box_fused`): one pass for uint8/uint16 images,
  vertical running sums in registers and horizontal sliding sums in shared memory.
  `box_auto` uses it for uint16 images and for the uint8 cases the two above decline,
  wherever its tile holds the box.
- `box_packed` (module `kernels.box_packed`): box_fused's design for uint8 images
  reading 32-bit words, two column sums per add; boxes up to 257 rows. Slower than
  box_fused on the H100 so far; `box_auto` uses it for uint8 boxes that the others
  decline.
- `box_separable`: a row-sum pass into a scratch image, then a column-sum pass.
  Cost per pixel grows with k.
- `box_running`: running sums. A column pass keeps a running sum down each
  (column, channel) lane (add the entering row, subtract the leaving one) into a
  narrow exact scratch (uint16 for uint8 images), then a row pass slides along
  each row in shared memory. The cost per pixel barely depends on k.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda, float32, float64, uint64

from . import box_fused as _fused
from . import box_packed as _packed
from . import box_plan
from . import box_tiled as _tiled
from . import box_twopass as _twopass
from .arrays import empty, start_address
from .device import border_index, saturate_int
from .launch import SMEM_LIMIT, cdiv, image_grid, launch, scratch
from .saturate import output_limits

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


@lru_cache(maxsize=64)
def _plans(shape: tuple, dtype: np.dtype, ksize: tuple) -> tuple[str, dict | None]:
    return box_plan.choose(shape, dtype, ksize)


def box_method(shape: tuple, dtype, ksize: tuple) -> str:
    """The implementation `box_auto` takes (`kernels.box_plan.choose`): "tiled" (uint8
    boxes up to TILED_MAX_BOX on a side that its tile holds), "twopass" (larger uint8
    boxes up to 257 columns), "fused" (uint8/uint16 boxes that fit its tile), "packed"
    (uint8 boxes up to 257 rows that the others decline) or "running"."""
    return _plans(tuple(shape), np.dtype(dtype), tuple(ksize))[0]


def box_choice(img, ksize: tuple, out=None) -> tuple[str, dict | None]:
    """(method, geometry) `box_auto` runs for this device image (and output, if given):
    `box_method`'s choice, except that an image whose first byte is not 4-byte aligned
    (a view such as d[1:] of an odd-width uint8 image) goes to box_fused (or
    box_running), because box_tiled, box_packed and box_twopass read it as 32-bit words; so does
    such an output where the kernel writes words (box_packed, box_tiled columns
    first)."""
    method, geometry = _plans(tuple(img.shape), np.dtype(img.dtype), tuple(ksize))
    writes_words = method in ("packed", "tiled")
    misaligned = start_address(img) % 4 or (
        out is not None and writes_words and start_address(out) % 4
    )
    if method in ("tiled", "packed", "twopass") and misaligned:
        fused = box_plan.plan(tuple(img.shape), img.dtype, tuple(ksize))
        return ("fused", fused) if fused is not None else ("running", None)
    return method, geometry


_RUNNERS = {
    "tiled": _tiled.box_tiled,
    "packed": _packed.box_packed,
    "fused": _fused.box_fused,
    "twopass": _twopass.box_twopass,
}


def box_auto(img, ksize, anchor, mode, cval, out=None, stream: int = 0):
    """The fastest exact box filter for the case (see `box_choice`): `box_tiled`,
    `box_twopass`, `box_fused`, `box_packed` or `box_running`, queued on `stream`.
    Same contract as all."""
    method, geometry = box_choice(img, ksize, out)
    run = _RUNNERS.get(method)
    if run is None:
        return box_running(img, ksize, anchor, mode, cval, out, stream)
    return run(img, ksize, anchor, mode, cval, out, geometry, stream)
