"""Launch geometry and arguments of `kernels.contour`, free of Numba (see kernels.box.plan)."""

from __future__ import annotations

import numpy as np

from ..common.launch import cdiv

THREADS = 128  # consecutive columns per block
RUN_Y = 8  # rows walked by each thread (8 measured fastest on the H100: 23 us vs 30 us at 16);
# kernels.contour.kernel._walk_interior is written out for exactly 8


def grid(height: int, width: int) -> tuple[int, int]:
    return cdiv(width, THREADS), cdiv(height, RUN_Y)


def scalar_args(dtype, mode: int, cval) -> tuple:
    """The kernel's (mode, cval, hi) arguments, typed as launched."""
    return mode, np.int64(cval), int(np.iinfo(np.dtype(dtype)).max)
