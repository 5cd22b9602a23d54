"""BGR -> gray exactly as OpenCV's cvtColor(COLOR_BGR2GRAY / BGRA2GRAY) for integers.

OpenCV computes Y = (3735*B + 19235*G + 9798*R + 2**14) >> 15 for uint8 and uint16
(fixed-point 0.114 / 0.587 / 0.299 with 15 fractional bits); we verified this
bit-exactly against cv2.cvtColor on random data. Plain Python, compiled by both the
CUDA kernels and the CPU backend.
"""

GRAY_B = 3735
GRAY_G = 19235
GRAY_R = 9798
GRAY_SHIFT = 15


def bgr_to_gray(b, g, r):
    """Gray level of one integer BGR pixel, as cv2.cvtColor rounds it."""
    return (GRAY_B * b + GRAY_G * g + GRAY_R * r + (1 << (GRAY_SHIFT - 1))) >> GRAY_SHIFT
