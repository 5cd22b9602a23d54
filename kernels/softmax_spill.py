"""Softmax of rows a little too wide for one block's shared memory: `block_spill`.

`block_spill` path of kernels.softmax. A block per row, as block_smem with its online
variant, but only the row's first `cache_packs` packs are cached in dynamic shared
memory (in the input dtype, element i of pack q at i * cache_packs + q); the packs
past them are read from global memory twice:

1. Pass 1 reads the whole row in order, cached packs first, caching them, and keeps
   per thread the running max and an online sum of exp (as block_uncached); the
   block reduces them to the row's max and sum.
2. Pass 2 writes the packs past the cache first, re-reading them while L2 still
   holds them (they were the last ones pass 1 read, a barrier ago), then the cached
   packs from shared memory.

With one block per SM holding ~220 KiB of a row, a 256 KiB float16 row is read from
DRAM once and only its last 32 KiB a second time from L2: at most ~4 MB of re-read
rows in flight across 132 SMs, where block_uncached's 33 MB (a whole row per SM)
mostly missed L2. No block waits for another (unlike `split`).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, from_dtype, uint32

from .launch import SMEM_LIMIT
from .packs import store_pack2
from .reduce import NEG_INF, block_allreduce_max, block_allreduce_sum
from .softmax_split import SIMULATOR, resident_blocks

SPILL_BLOCK = 1024  # threads per block: one block per SM holds the cache
# Shared memory the block's reductions use besides the cache (two 32-float arrays),
# with room to spare.
STATIC_RESERVE = 1024


@functools.cache
def spill_kernel(in_dtype, out_dtype, pack: int, unroll: int, log: bool, cache_packs: int):
    """The block_spill kernel for one (dtypes, pack, unroll, log, cache size) combination.

    Launch as `kernel[grid, block, 0, cache_packs * pack * itemsize(in)](x, y, rows,
    cols)` with x, y the (rows, cols) arrays, any grid (blocks stride over rows) and a
    1-D block of a multiple of 32 threads. Packs of `pack` elements are loaded and
    stored with one access (kernels.packs), `unroll` of them in flight per thread.
    """
    # Imported here: kernels.softmax imports this module inside plan().
    from .softmax import _online_folder, _pack_loader, exp32, exp_over

    in_t = from_dtype(np.dtype(in_dtype))
    P, U, S = pack, unroll, cache_packs
    NBI = pack * np.dtype(in_dtype).itemsize
    NBO = pack * np.dtype(out_dtype).itemsize
    load_packs = _pack_loader(P, NBI, U)
    fold = _online_folder(P, U)

    @cuda.jit
    def softmax_block_spill(x, y, rows, cols):
        buf = cuda.shared.array(0, in_t)
        a = cuda.local.array((U, P), float32)
        tout = cuda.local.array(P, float32)
        tid = uint32(cuda.threadIdx.x)
        nthreads = uint32(cuda.blockDim.x)
        packs = uint32(cols // P)
        cached = min(packs, uint32(S))
        urows = uint32(rows)
        row = uint32(cuda.blockIdx.x)
        while row < urows:
            # Pass 1, in pack order: the cached packs, then the rest.
            m = NEG_INF
            d = float32(0.0)
            p = tid
            while p < packs:
                n = load_packs(x, row, p, nthreads, packs, a)
                cm = m
                for u in range(U):
                    if u < n:
                        q = uint32(p + u * nthreads)
                        for i in range(P):
                            v = a[u, i]
                            if q < cached:
                                buf[uint32(i * S + q)] = in_t(v)
                            cm = max(cm, v)
                m, d = fold(a, n, cm, m, d)
                p = uint32(p + U * nthreads)
            rmax = block_allreduce_max(m)
            s = d * exp32(m - rmax) if m > NEG_INF else float32(0.0)
            rsum = block_allreduce_sum(s)
            lse = math.log(rsum)
            l2s = float32(math.log2(rsum))
            # Pass 2: the packs past the cache (read last, so most likely in L2) ...
            p = uint32(cached + tid)
            while p < packs:
                n = load_packs(x, row, p, nthreads, packs, a)
                for u in range(U):
                    if u < n:
                        for i in range(P):
                            v = a[u, i] - rmax
                            tout[i] = v - lse if log else exp_over(v, l2s)
                        store_pack2(y, row, uint32((p + u * nthreads) * P), tout, NBO)
                p = uint32(p + U * nthreads)
            # ... then the cached ones. A thread reads back only the slots it wrote (pack
            # q = tid mod blockDim), so neither this loop nor the next row's first one
            # needs a barrier.
            p = tid
            while p < cached:
                for i in range(P):
                    v = float32(buf[uint32(i * S + p)]) - rmax
                    tout[i] = v - lse if log else exp_over(v, l2s)
                store_pack2(y, row, uint32(p * P), tout, NBO)
                p = uint32(p + nthreads)
            row = uint32(row + cuda.gridDim.x)

    return softmax_block_spill


def default_cache_packs(pack: int, itemsize: int) -> int:
    """The packs a block can cache: the device's opt-in shared memory per block, less
    STATIC_RESERVE for the reductions."""
    dev = cuda.get_current_device()
    limit = int(getattr(dev, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", 48 * 1024))
    return (limit - STATIC_RESERVE) // (pack * itemsize)


def plan_spill(
    rows: int,
    cols: int,
    in_dtype,
    out_dtype,
    pack: int,
    log: bool,
    *,
    block_size: int | None = None,
    unroll: int | None = None,
    cache_packs: int | None = None,
):
    """(Plan, kernel) of the block_spill path: SPILL_BLOCK threads (or block_size), as
    many blocks as the device holds at once (one per SM with the default cache),
    `cache_packs` packs cached (default_cache_packs; tests pass fewer).
    Raises ValueError when the device cannot give the cache's shared memory."""
    from .softmax import Plan, _block_signature  # kernels.softmax imports this module

    in_dtype, out_dtype = np.dtype(in_dtype), np.dtype(out_dtype)
    packs = cols // pack
    cache_packs = min(packs, cache_packs or default_cache_packs(pack, in_dtype.itemsize))
    smem = cache_packs * pack * in_dtype.itemsize
    size = block_size or SPILL_BLOCK
    unroll = unroll or 4
    kernel = spill_kernel(in_dtype, out_dtype, pack, unroll, bool(log), cache_packs)
    held = 0
    if not (SIMULATOR and smem > SMEM_LIMIT):  # the simulator has no opt-in
        held = resident_blocks(kernel, _block_signature(in_dtype, out_dtype), size, smem)
    if not held:
        raise ValueError(
            f"method 'block_spill' cannot launch: the device does not give a block {smem} "
            "bytes of shared memory"
        )
    grid = max(1, min(rows, held))
    return Plan("block_spill", pack, grid, (size, 1), smem, unroll=unroll), kernel
