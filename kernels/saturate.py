"""Rounding and saturation of a float accumulator to an integer dtype, as OpenCV does.

Plain Python, compiled by both the CUDA kernels and the CPU backend. OpenCV's
`saturate_cast<uchar/ushort>(float)` rounds half to even (cvRound) and clamps.
"""


def saturate_int(acc, lo, hi):
    """Return `acc` rounded half-to-even, as an integer clamped to [lo, hi]."""
    r = round(acc)
    if r < lo:
        return lo
    if r > hi:
        return hi
    return r
