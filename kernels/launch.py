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
