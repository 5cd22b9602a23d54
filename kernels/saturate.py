"""Rounding and saturation of a float accumulator to an integer dtype, as OpenCV does.

Plain Python, compiled by both the CUDA kernels and the CPU backend. OpenCV's
`saturate_cast<uchar/ushort>(float)` rounds half to even (cvRound) and clamps.
"""

import numpy as np


def output_limits(dtype) -> tuple[int, int, bool]:
    """(lo, hi, is_int) for results stored as `dtype`: the unsigned range, or (0, 0, False)
    for float dtypes, which are stored unrounded."""
    dt = np.dtype(dtype)
    if dt.kind == "u":
        info = np.iinfo(dt)
        return int(info.min), int(info.max), True
    return 0, 0, False


def saturate_int(acc, lo, hi):
    """Return `acc` rounded half-to-even, as an integer clamped to [lo, hi]."""
    r = round(acc)
    if r < lo:
        return lo
    if r > hi:
        return hi
    return r
