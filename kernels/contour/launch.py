"""The contour map's launch: `contour`, with its kernel named without importing Numba.

The fused kernel lives in `kernels.contour.kernel` (one per channel count, made by
`_make_contour_fused`); here it is named by a `kernels.common.refs.KernelRef`
(`contour_kernel`), so a shipped or cached binary runs without Numba. This module
imports no Numba.
"""

from __future__ import annotations

import functools

from ..common.arrays import empty
from ..common.launch import launch
from ..common.refs import KernelRef
from .plan import THREADS, grid, scalar_args


def contour_kernel(channels: int) -> KernelRef:
    """The fused contour kernel for images of `channels` channels, by name: one ref per
    channel count (a NumPy int names the same one)."""
    return _contour_ref(int(channels))


@functools.cache
def _contour_ref(channels: int) -> KernelRef:
    return KernelRef("kernels.contour.kernel", "_make_contour_fused", (channels,))


def contour(img, mode: int, cval: int, out=None, stream: int = 0):
    """Contour map of a device image (H, W, C), C in {1, 3, 4}, uint8 or uint16,
    queued on `stream`. Returns `out`, an (H, W) device array of the image's dtype
    (allocated when None)."""
    height, width, channels = img.shape
    if out is None:
        out = empty((height, width), img.dtype, stream)
    mode, cval, hi = scalar_args(img.dtype, mode, cval)
    args = (img, img.reshape(img.size), mode, cval, hi, out, out.reshape(out.size))
    launch(contour_kernel(channels), grid(height, width), THREADS, args, stream)
    return out
