"""An image's byte lanes as the box kernels address them, shared by several of them.

A uint8/uint16 (H, W, C) image is read as the (H, W * C) rows of its byte (or
element) lanes: lane l of a tile starting at pixel `left` is pixel left + l // C,
channel l % C. `lane_column` (a device function: box_fused, box_packed and
box_tiled's loader) maps a lane to its column through the border; `words` and
`flat_images` (host) hand a uint8 image and its output to the kernels that read and
write it as 32-bit words (box_packed, box_tiled, box_twopass).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ..common.arrays import empty, start_address
from ..common.device import border_index


@cuda.jit(device=True)
def lane_column(lane, n_lanes, left, width, channels, mode):
    """Byte column of `lane` (pixel left + lane // C, channel lane % C) in a row, or -1
    for the constant border and for lanes past the tile."""
    if lane >= n_lanes:
        return -1
    p = lane // channels
    xx = border_index(left + p, width, mode)
    if xx < 0:
        return -1
    return xx * channels + (lane - p * channels)


def words(flat):
    """The whole 32-bit words of a flat uint8 device array (its last n % 4 bytes are
    left out), as a uint32 device array over the same memory."""
    n4 = flat.shape[0] // 4
    return flat[: 4 * n4].view(np.uint32)


def flat_images(img, out, kernel_name: str, stream: int = 0):
    """(out, src, dst, n): the output (allocated when None), then the (H, W, C) uint8
    device image and the output as flat byte arrays of n elements, for the kernels that
    read the image as 32-bit words; ValueError unless the image starts on a 4-byte
    boundary."""
    if start_address(img) % 4:
        raise ValueError(
            f"{kernel_name} reads 32-bit words: the image must start on a 4-byte boundary"
        )
    if out is None:
        out = empty(img.shape, img.dtype, stream)
    n = img.shape[0] * img.shape[1] * img.shape[2]
    return out, img.reshape(n), out.reshape(n), n
