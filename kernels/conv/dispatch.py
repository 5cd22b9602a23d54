"""2-D correlation (OpenCV's filter2D semantics) in Numba CUDA: the entry point, `correlate`.

Images are (H, W, C) device arrays of uint8, uint16 or float32; outputs have the
input's dtype and shape. Weights are a (kh, kw) float32 device array, not flipped.
The anchor (ay, ax) is the weight placed on the output pixel. Borders use
`kernels.common.border_index` codes; `cval` is the constant-border value, already cast
to the image's dtype. Accumulation is float32; integer outputs are rounded half to
even and saturated to [lo, hi] (`is_int`), as cv2.filter2D does.

`correlate` runs one method, which the caller chose (`kernels.conv.plan.auto_method`
for "auto"): the generic kernels of `kernels.conv.generic` ("naive", "padded",
"tiled"), the register-window one of `kernels.conv.window` ("window") or the
register-blocked one of `kernels.conv.blocked` ("blocked"). They are named by the
`kernels.common.refs.KernelRef`s of `kernels.conv.launch`: this module imports no
Numba, and a kernel that ships runs without it. Box filters live in `kernels.box`.
"""

from __future__ import annotations

import functools

import numpy as np

from ..common.arrays import empty
from ..common.launch import SMEM_LIMIT, image_grid, launch, scratch
from ..common.saturate import output_limits
from .launch import (
    correlate_blocked,
    correlate_naive,
    correlate_tiled,
    correlate_valid,
    correlate_window,
    pad_image,
)
from .plan import (
    MAX_SIDE,
    WINDOW_TX,
    WINDOW_TY,
    auto_method,
    fits,
    generic_method,
    kernel_rank,
    low_rank_factors,
    max_separable_rank,
    tiled_fits,
    tiled_smem_bytes,
    window_fits,
    window_grid,
    window_smem_bytes,
)


def correlate(img, weights, anchor, mode, cval, method, out=None, stream: int = 0):
    """Correlate a device image (H, W, C) with device weights (kh, kw); return `out`.

    method: "naive", "padded", "tiled", "window" or "blocked" (the caller resolves
    "auto"); ValueError for another, or for "tiled" and "window" where the kernel's
    tile does not fit shared memory. Queued on `stream`.
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
        correlate_blocked(img, weights, anchor, mode, cval, out, stream=stream)
    elif method == "tiled":
        smem = tiled_smem_bytes(kh, kw)
        if smem > SMEM_LIMIT:
            raise ValueError(f"a {kh}x{kw} kernel needs {smem} bytes of shared memory")
        args = (img, weights, ay, ax, mode, cval, lo, hi, is_int, out)
        launch(correlate_tiled, grid, block, args, stream, smem)
    elif method == "window":
        smem = window_smem_bytes(kh, kw)
        if smem > SMEM_LIMIT:
            raise ValueError(f"a {kh}x{kw} kernel needs {smem} bytes of shared memory")
        args = (img, weights, ay, ax, mode, cval, lo, hi, is_int, out)
        launch(
            correlate_window, window_grid(img.shape), (WINDOW_TX, WINDOW_TY, 1), args, stream, smem
        )
    else:
        raise ValueError(f"unknown correlation method {method!r}")
    return out


# ------------------------------------------------------------------- the method


class MethodRefused(ValueError):
    """A filter method asked for by name does not take the kernel."""


@functools.lru_cache(maxsize=64)
def prepared(shape: tuple, data: bytes, method: str) -> tuple[str, tuple]:
    """(resolved method (`resolve`), low-rank factors as ((row, col, row_sum), ...) for
    "separable") for a kernel given by its shape and bytes: the SVD runs once."""
    kernel = np.frombuffer(data, dtype=np.float32).reshape(shape)
    method = resolve(method, kernel)
    if method != "separable":
        return method, ()
    kh, kw = shape
    terms = tuple(
        (
            row[None, :].astype(np.float32),
            col[:, None].astype(np.float32),
            float(np.sum(row, dtype=np.float64)),
        )  # fmt: skip
        for col, row in low_rank_factors(kernel, max_separable_rank(kh, kw))
    )
    return method, terms


def resolve(method: str, kernel: np.ndarray) -> str:
    """The method that runs for `method` ("auto": `plan.auto_method`, else
    `plan.generic_method`) and this kernel; MethodRefused, naming what does take it,
    where a named method does not."""
    kh, kw = kernel.shape
    if method == "separable":
        most, rank = max_separable_rank(kh, kw), kernel_rank(kernel)
        if rank > most:
            raise MethodRefused(
                f"method 'separable' needs a rank-1 kernel (an outer product) or, for a "
                f"{kh}x{kw} kernel, a sum of at most {most} of them; this one has rank {rank}"
            )
        if max(kh, kw) > MAX_SIDE:
            raise MethodRefused(f"method 'separable' handles kernels up to {MAX_SIDE} wide")
        return method
    if method == "auto":
        return auto_method(kernel) or generic_method(kh, kw)
    if method == "blocked" and not fits(kh, kw):
        raise MethodRefused(
            f"method 'blocked' handles kernels up to {MAX_SIDE}x{MAX_SIDE}; "
            "use tiled, padded or naive"
        )
    if method == "window" and not window_fits(kh, kw):
        raise MethodRefused(
            f"method 'window' needs {window_smem_bytes(kh, kw)} bytes of shared memory "
            f"for a {kh}x{kw} kernel (limit {SMEM_LIMIT}); use tiled, padded or naive"
        )
    if method == "tiled" and not tiled_fits(kh, kw):
        raise MethodRefused(
            f"method 'tiled' needs {tiled_smem_bytes(kh, kw)} bytes of shared memory "
            f"for a {kh}x{kw} kernel (limit {SMEM_LIMIT}); use naive or padded"
        )
    return method
