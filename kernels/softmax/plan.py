"""A softmax call's plan: the path `kernels.softmax.dispatch.plan` chose and its launch
geometry. Nothing here imports Numba."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """How one call runs: the path and its launch geometry."""

    method: str
    pack: int
    grid: int
    block: tuple[int, int]
    smem: int = 0  # dynamic shared memory bytes per block
    width: int = 0  # warp path: lanes per row
    cols_per_thread: int = 0  # warp path
    rows_per_access: int = 1  # warp path
    unroll: int = 1  # block paths: packs in flight per thread
    online: bool = False  # block_smem: input cached in its dtype, online sum
    chunks: int = 0  # split: blocks (chunks) per row
    stages: int = 0  # split: buffers a block (kernels.softmax.split)
