"""An image's byte lanes as the box kernels address them, shared by several of them.

A uint8/uint16 (H, W, C) image is read as the (H, W * C) rows of its byte (or
element) lanes: lane l of a tile starting at pixel `left` is pixel left + l // C,
channel l % C. `lane_column` (a device function: box_fused, box_packed and
box_tiled's loader) maps a lane to its column through the border. The host side
(`words`, `flat_images`: a uint8 image and its output as the kernels that read and
write 32-bit words take them) is in `kernels.box.launch`, free of Numba.
"""

from __future__ import annotations

from numba import cuda

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
