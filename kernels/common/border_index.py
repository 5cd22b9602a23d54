"""Border modes as index maps, in plain Python so CUDA and CPU code share one source.

`border_index` is compiled as a CUDA device function in `kernels.common.device` and as an
`@njit` function in the CPU backend; it is also callable from Python.
The mode codes are imgfilter's own (see `imgfilter.border` for names and OpenCV
constants). Semantics follow OpenCV's `cv::borderInterpolate`, with `wrap` meaning
periodic extension (`np.pad(mode="wrap")`).
"""

REFLECT101 = 0  # gfedcb|abcdefgh|gfedcba   (OpenCV BORDER_REFLECT_101, the default)
REFLECT = 1  # fedcba|abcdefgh|hgfedcb      (BORDER_REFLECT)
REPLICATE = 2  # aaaaaa|abcdefgh|hhhhhhh    (BORDER_REPLICATE)
CONSTANT = 3  # vvvvvv|abcdefgh|vvvvvvv     (BORDER_CONSTANT, value v)
WRAP = 4  # cdefgh|abcdefgh|abcdefg         (BORDER_WRAP, periodic)


def border_index(p, n, mode):
    """Map coordinate `p` (any integer) onto [0, n) for an axis of length `n` >= 1.

    Returns -1 for CONSTANT when `p` is outside, meaning "use the border value".
    Reflections repeat as often as needed, so kernels larger than the image work.
    """
    if p >= 0 and p < n:
        return p
    if mode == CONSTANT:
        return -1
    if mode == REPLICATE:
        return 0 if p < 0 else n - 1
    if mode == WRAP:
        p = p % n
        return p + n if p < 0 else p
    if n == 1:
        return 0
    delta = 1 if mode == REFLECT101 else 0
    while p < 0 or p >= n:
        if p < 0:
            p = -p - 1 + delta
        else:
            p = 2 * n - 1 - p - delta
    return p
