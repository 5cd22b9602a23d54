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


_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds a float32 to an integer


def saturate_f32(acc, lo, hi):
    """`saturate_int` in float32 arithmetic, for a float32 `acc` and integer bounds
    |lo|, |hi| < 2**22 (uint8 and uint16 outputs): the same value for every input.

    Clamping first is the same as clamping the rounded value (the bounds are
    integers); NaN gives lo (`saturate_int` on the GPU gives clamp(0), the same for
    the unsigned outputs, whose lo is 0). In [lo, hi], adding 1.5 * 2**23 rounds half
    to even in float32 and subtracting it is exact. Compiled for the GPU this is a
    clamp, two adds and a truncation, where `saturate_int` rounds in float64 and
    clamps in 64-bit integers.
    """
    v = np.float32(acc)
    flo = np.float32(lo)
    fhi = np.float32(hi)
    if not v > flo:  # below lo, or NaN
        v = flo
    if v > fhi:
        v = fhi
    return np.int32((v + _MAGIC) - _MAGIC)
