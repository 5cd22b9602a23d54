"""Warp and block all-reductions (max, sum) as CUDA device functions.

Every thread taking part gets the result (an all-reduce), so callers need no extra
broadcast. Values are float32; `width` is the number of consecutive lanes reduced
together: a power of two in 1..32, groups aligned to multiples of `width` inside a
warp. `mask` names the lanes that call (all lanes of the caller's group, or more);
`group_mask(width)` builds it. Butterfly (xor) shuffles stay inside an aligned
power-of-two group, so sub-warp groups reduce independently.

Block versions reduce over all threads of a 1-D block (blockDim.x a multiple of 32,
at most 1024): warp all-reduce, one partial per warp through a 32-slot shared
array, then every warp all-reduces the partials. They end with a barrier, so the
shared slots can be reused by the next call; every thread of the block must call.
"""

from __future__ import annotations

import math

from numba import cuda, float32, uint32

WARP = 32
FULL_MASK = 0xFFFFFFFF
NEG_INF = float32(-math.inf)


@cuda.jit(device=True, inline="always")
def group_mask(width):
    """Mask of the `width`-lane group holding the calling lane (width a power of two)."""
    base = (cuda.laneid // width) * width
    return (uint32(FULL_MASK) >> uint32(WARP - width)) << uint32(base)


@cuda.jit(device=True, inline="always")
def warp_allreduce_max(val, width, mask):
    """Max of `val` over the caller's aligned group of `width` lanes."""
    offset = width // 2
    while offset > 0:
        val = max(val, cuda.shfl_xor_sync(mask, val, offset))
        offset //= 2
    return val


@cuda.jit(device=True, inline="always")
def warp_allreduce_sum(val, width, mask):
    """Sum of `val` over the caller's aligned group of `width` lanes."""
    offset = width // 2
    while offset > 0:
        val += cuda.shfl_xor_sync(mask, val, offset)
        offset //= 2
    return val


@cuda.jit(device=True, inline="always")
def block_allreduce_max(val):
    """Max of `val` over the whole 1-D block; every thread gets it."""
    partial = cuda.shared.array(WARP, float32)
    lane = cuda.threadIdx.x % WARP
    warp = cuda.threadIdx.x // WARP
    val = warp_allreduce_max(val, WARP, FULL_MASK)
    if lane == 0:
        partial[warp] = val
    cuda.syncthreads()
    val = partial[lane] if lane < cuda.blockDim.x // WARP else NEG_INF
    val = warp_allreduce_max(val, WARP, FULL_MASK)
    cuda.syncthreads()
    return val


@cuda.jit(device=True, inline="always")
def block_allreduce_sum(val):
    """Sum of `val` over the whole 1-D block; every thread gets it."""
    partial = cuda.shared.array(WARP, float32)
    lane = cuda.threadIdx.x % WARP
    warp = cuda.threadIdx.x // WARP
    val = warp_allreduce_sum(val, WARP, FULL_MASK)
    if lane == 0:
        partial[warp] = val
    cuda.syncthreads()
    val = partial[lane] if lane < cuda.blockDim.x // WARP else float32(0.0)
    val = warp_allreduce_sum(val, WARP, FULL_MASK)
    cuda.syncthreads()
    return val
