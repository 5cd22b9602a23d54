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
The kernels are in `kernels.box.running_kernels`; here they are named by
`kernels.common.refs.KernelRef`, so shipped ones run without importing Numba.
"""

from __future__ import annotations

import functools

import numpy as np

from ..common.arrays import empty
from ..common.launch import SMEM_LIMIT, cdiv, image_grid, launch, scratch
from ..common.refs import KernelRef
from ..common.saturate import output_limits
from .plan import RUNNING_ROW_TILE, RUNNING_RUN, RUNNING_STRIP_ROWS

_KERNELS = "kernels.box.running_kernels"
box_rows = KernelRef(_KERNELS, "box_rows")
box_cols = KernelRef(_KERNELS, "box_cols")
box_column_sums = KernelRef(_KERNELS, "box_column_sums")


@functools.cache
def row_sums_kernel(exact32: bool) -> KernelRef:
    """The row pass that stages column sums as float32 (exact32) or float64, by name."""
    return KernelRef(_KERNELS, "row_sums", (exact32,))


def _exact_in_float32(dtype, kh: int, kw: int) -> bool:
    """Whether every partial box sum of this image is an integer below 2**24."""
    return np.dtype(dtype) == np.uint8 and kh * kw * 255 < 2**24


# ----------------------------------------------------------------- separable passes


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
    tile_w = RUNNING_ROW_TILE
    smem = ((tile_w + kw - 1) * channels + tile_w * channels) * itemsize
    if smem > SMEM_LIMIT:
        return box_separable(img, ksize, anchor, mode, cval, out, stream)
    lo, hi, is_int = output_limits(img.dtype)
    if out is None:
        out = empty(img.shape, img.dtype, stream)
    sums = scratch((height, width * channels), _column_sum_dtype(img.dtype, kh), stream)
    lanes = width * channels
    col_cval = np.int64(cval) if is_int else np.float64(cval)
    grid = (cdiv(lanes, 128), cdiv(height, RUNNING_STRIP_ROWS))
    args = (img, kh, ay, mode, col_cval, RUNNING_STRIP_ROWS, sums)
    launch(box_column_sums, grid, 128, args, stream)
    stage_type = np.float32 if exact32 else np.float64
    zero = stage_type(0)
    area = stage_type(kh * kw)
    threads = cdiv(tile_w, RUNNING_RUN) * channels
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
    launch(row_sums_kernel(exact32), (cdiv(width, tile_w), height), threads, args, stream, smem)
    return out
