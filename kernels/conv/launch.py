"""The correlation kernels named without importing Numba, and the register-blocked
launches: `correlate_blocked`, `correlate_low_rank` and `correlate_separable`.

Same contract as `kernels.conv.dispatch.correlate` (which launches the other kernels
through the refs here): (H, W, C) device images, float32 weights, borders by
`kernels.common.border_index` code, float32 accumulation, integer outputs rounded half
to even and saturated. The kernels live in `kernels.conv.generic`,
`kernels.conv.window` and `kernels.conv.blocked`; here each is named by one
`kernels.common.refs.KernelRef`, so a shipped or cached binary runs without Numba.
This module imports no Numba.
"""

from __future__ import annotations

import functools

import numpy as np

from ..common.arrays import is_c_contiguous
from ..common.launch import launch, scratch
from ..common.refs import KernelRef
from .plan import TX, TY, grid, offsets_fit, scalar_args

_GENERIC = "kernels.conv.generic"
correlate_naive = KernelRef(_GENERIC, "correlate_naive")
pad_image = KernelRef(_GENERIC, "pad_image")
correlate_valid = KernelRef(_GENERIC, "correlate_valid")
correlate_tiled = KernelRef(_GENERIC, "correlate_tiled")
correlate_window = KernelRef("kernels.conv.window", "correlate_window")


def blocked_kernel(kh: int, kw: int, wide: bool = False, accumulate: bool = False) -> KernelRef:
    """The register-blocked kernel for a kh x kw kernel (`kernels.conv.blocked.kernel_for`),
    by name: one ref per kernel, whatever the arguments' spelling (NumPy ints, defaults).
    `wide`: 64-bit element offsets (images of 2**32 elements or more); `accumulate`: the
    variant that adds a float32 array before the store."""
    return _blocked_ref(int(kh), int(kw), bool(wide), bool(accumulate))


@functools.cache
def _blocked_ref(kh: int, kw: int, wide: bool, accumulate: bool) -> KernelRef:
    return KernelRef("kernels.conv.blocked", "kernel_for", (kh, kw, wide, accumulate))


def correlate_blocked(img, weights, anchor, mode, cval, out, acc=None, stream: int = 0):
    """Launch the blocked kernel on a device image (H, W, C); `out` is filled.

    `out` may differ in dtype from `img` (a float32 intermediate, say): rounding and
    saturation follow out's dtype. With `acc` (float32, out's shape; may be out
    itself) out receives acc + the correlation, rounded once. All must be C-contiguous
    (the kernel addresses them by flat element offsets), else ValueError, as for an acc
    of another shape or dtype. Queued on `stream`.
    """
    arrays = (img, out) if acc is None else (img, out, acc)
    if not all(is_c_contiguous(a) for a in arrays):
        raise ValueError("the blocked kernel needs C-contiguous image, output and sum arrays")
    if acc is not None and (acc.shape != out.shape or acc.dtype != np.float32):
        raise ValueError(
            f"acc must be float32 of out's shape {out.shape}, not {acc.dtype} {acc.shape}"
        )
    kh, kw = weights.shape
    flat = weights.reshape(kh * kw)
    args = scalar_args(out.dtype, anchor, mode, cval)
    kernel = blocked_kernel(kh, kw, not offsets_fit(img.shape), acc is not None)
    launch(kernel, grid(img.shape, kh), (TX, TY, 1), (img, flat, *args, out, *arrays[2:]), stream)
    return out


def correlate_low_rank(img, terms, anchor, mode, cval, out, stream: int = 0):
    """Correlate with sum_k outer(col_k, row_k), a kernel of rank len(terms).

    terms: [(row (1, kw), col (kh, 1), row_sum)], float32 device arrays and the sum of
    row. One term is `correlate_separable`. More: each term's row pass goes into a
    float32 scratch image, and its column pass adds its result to a float32 running
    sum (the first one starts it); the last column pass writes that sum plus its own
    result to out, rounded and saturated (integer outputs) once, as a single 2-D pass
    rounds its sum. No element-wise passes: per output element r float32 writes and
    reads of the row passes' scratch and 2r - 2 of the running sum.
    """
    if len(terms) == 1:
        row, col, row_sum = terms[0]
        return correlate_separable(img, row, col, anchor, mode, cval, row_sum, out, stream)
    ay, ax = anchor
    tmp = scratch(img.shape, np.float32, stream)
    acc = scratch(img.shape, np.float32, stream)
    last = len(terms) - 1
    for k, (row, col, row_sum) in enumerate(terms):
        correlate_blocked(img, row, (0, ax), mode, float(cval), tmp, stream=stream)
        target = out if k == last else acc
        col_cval = float(cval) * row_sum
        correlate_blocked(tmp, col, (ay, 0), mode, col_cval, target, acc if k else None, stream)
    return out


def correlate_separable(img, row, col, anchor, mode, cval, row_sum, out, stream: int = 0):
    """Correlate with the rank-1 kernel outer(col, row): a row pass, then a column pass.

    row (1, kw) and col (kh, 1) are float32 device arrays, row_sum the sum of row.
    The row pass writes a float32 scratch image (no rounding in between); borders are
    separable, except that a constant border seen by the column pass is a row of
    cval, whose row-pass value is cval * row_sum.
    """
    ay, ax = anchor
    tmp = scratch(img.shape, np.float32, stream)
    correlate_blocked(img, row, (0, ax), mode, float(cval), tmp, stream=stream)
    correlate_blocked(tmp, col, (ay, 0), mode, float(cval) * row_sum, out, stream=stream)
    return out
