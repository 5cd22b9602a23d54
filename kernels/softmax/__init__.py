"""Softmax and log-softmax over the last axis of a (rows, cols) array.

`softmax` and `log_softmax` are the entry points (`kernels.softmax.dispatch`, which
plans a call and launches it). The kernels: `kernels` (warp, block_smem,
block_uncached) and `split` (a row over several blocks, with its planner and
launcher); `numerics` holds what they share (exponentials, pack loader, online
normaliser, `Plan`).
"""

from .dispatch import log_softmax, softmax

__all__ = ["log_softmax", "softmax"]
