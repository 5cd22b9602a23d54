"""Launch geometry shared by the image kernels."""

from __future__ import annotations

BLOCK_X = 32  # threads along a row: one warp reads 32 consecutive pixels
BLOCK_Y = 8
SMEM_LIMIT = 48 * 1024  # dynamic shared memory a block may use without opting in


def cdiv(a: int, b: int) -> int:
    """Ceiling division for positive integers."""
    return -(-a // b)


def image_grid(height: int, width: int, channels: int) -> tuple[tuple, tuple]:
    """(grid, block) covering an (H, W, C) image: x over columns, y over rows, z channels."""
    block = (BLOCK_X, BLOCK_Y, 1)
    grid = (cdiv(width, BLOCK_X), cdiv(height, BLOCK_Y), channels)
    return grid, block


_SCRATCH: dict = {}
_SCRATCH_KEEP = 4


def scratch(shape: tuple, dtype):
    """A device work buffer of this shape and dtype, reused across calls.

    cudaMalloc and cudaFree cost far more than a fast filter; launches on the
    default stream run in order, so one buffer per (shape, dtype) is safe to reuse.
    Keeps the most recent few.
    """
    from numba import cuda

    key = (tuple(shape), str(dtype))
    buf = _SCRATCH.pop(key, None)
    if buf is None:
        buf = cuda.device_array(shape, dtype=dtype)
    _SCRATCH[key] = buf
    while len(_SCRATCH) > _SCRATCH_KEEP:
        _SCRATCH.pop(next(iter(_SCRATCH)))
    return buf
