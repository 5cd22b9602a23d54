"""Softmax of rows too wide for one block, the row's loads shared out as they happen.

A variant of the `split` path (kernels.softmax_split) with the same exchange of
(max, sum) pairs between a row's blocks, but without fixed chunks. A row's `chunks`
blocks share a per-row counter of *slabs* (32 * unroll consecutive packs, one load
step of a warp): each warp of each block takes a free slot of its block's shared
memory and the row's next slab, loads the slab into the slot, and takes another,
until the row has no slab left or the block's `slots` are full. So a block that
loads faster takes more of the row, and a row's blocks finish loading within about
one slab of each other; with fixed chunks the block with the slowest chunk set the
row's pace while its siblings waited (4.6 us per item on the H100, BENCHMARKS.md
"Softmax").

The capacity has slack: a block has slots = ceil(slabs / chunks) + slack, so the
row is always taken by its own blocks (chunks * slots >= slabs) and a block can
take `slack` more slabs than its even share.

Per item (ticket t: row t // chunks):
1. Each warp takes (slot, slab) pairs: a shared-memory atomic for the slot, then a
   global one on the row's slab counter. Its lane 0 takes the next pair before
   loading the current slab, so the atomics' latency hides behind the loads.
   `slab_of` records the slab each slot holds; running max and online sum of exp
   per thread.
2. The block's pair is published and the row's pairs combined as in the split path
   (arrival counter, spin, atomic reads at L2).
3. The block writes the outputs of its filled slots, slot z by warp z % warps.

Counters: 1 + 2 * rows int32 (ticket, per-row arrivals, per-row slab counters),
zeroed again by the launch (the last block out of a row zeroes both of its
counters). Forward progress as the split path: a block's loads never wait for
another block, only its publish does, for blocks of its own row.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import config as _numba_config
from numba import cuda, float32, from_dtype, int32, uint32

from .launch import cdiv
from .packs import load_pack1, store_pack2, store_words1, unpack_word

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)
NEG_INF = float32(-math.inf)
FULL_MASK = 0xFFFFFFFF
WARP = 32


def slab_packs(unroll: int) -> int:
    """Packs per slab: one warp's load step of `unroll` packs per lane."""
    return WARP * unroll


def slots_per_block(packs: int, unroll: int, chunks: int, slack: int) -> int:
    """A block's slab slots: its even share of the row's slabs plus `slack`."""
    return cdiv(cdiv(packs, slab_packs(unroll)), chunks) + slack


@functools.cache
def steal_kernel(
    in_dtype,
    out_dtype,
    pack: int,
    unroll: int,
    chunks: int,
    warps: int,
    slots: int,
    log: bool,
    packed: bool,
    bounds: tuple | None = None,
):
    """The slab-stealing split kernel for one build.

    Launch with `warps * 32` threads per block (compiled in: warp w writes slots w,
    w + warps, ...), any grid the device holds at once (at most rows * chunks
    useful) and `slots * slab_packs(unroll) * pack * itemsize(in)` bytes of dynamic
    shared memory, as `kernel(x, y, rows, cols, counters, partials)`: counters an
    int32 array of 1 + 2 * rows zeros (left zeroed), partials float32 of 2 * rows *
    chunks. The caller makes sure chunks * slots covers a row's slabs.
    packed: slots hold the raw words of whole packs (packs of 4 bytes or more),
    else element by element (element i of slot pack s at i * capacity + s).
    """
    # Imported here: kernels.softmax imports kernels.softmax_split inside plan().
    from .softmax import _online_folder, _pack_loader, exp32, exp_over

    in_t = from_dtype(np.dtype(in_dtype))
    P, U, C, W, SLOTS = pack, unroll, chunks, warps, slots
    SLAB = slab_packs(U)
    CAP = SLOTS * SLAB  # packs the buffer holds
    NBI = pack * np.dtype(in_dtype).itemsize
    NBO = pack * np.dtype(out_dtype).itemsize
    PACKED = packed and NBI >= 4
    NW = max(1, NBI // 4)
    PW = P // NW
    ISZ = np.dtype(in_dtype).itemsize
    load_packs = _pack_loader(P, NBI, U)
    load_words = _pack_loader(P, NBI, U, raw=PACKED)
    fold = _online_folder(P, U)

    @cuda.jit(device=True, inline="always")
    def merge(m, d, om, od):
        """The (max, sum of exp(x - max)) pair of two sets given as pairs."""
        nm = max(m, om)
        if nm == NEG_INF:
            return nm, float32(0.0)
        return nm, d * exp32(m - nm) + od * exp32(om - nm)

    @cuda.jit(device=True, inline="always")
    def warp_merge(m, d):
        """merge over the 32 lanes of a warp; every lane gets the result."""
        offset = 16
        while offset > 0:
            om = cuda.shfl_xor_sync(FULL_MASK, m, offset)
            od = cuda.shfl_xor_sync(FULL_MASK, d, offset)
            m, d = merge(m, d, om, od)
            offset //= 2
        return m, d

    @cuda.jit(device=True, inline="always")
    def take(used, counters, taken, slabs):
        """(slot, slab): a free slot of the block and, if there was one, the row's
        next slab (slabs when the slots or the row have run out)."""
        z = cuda.atomic.add(used, 0, 1)
        if z >= SLOTS:
            return int32(SLOTS), slabs
        return z, cuda.atomic.add(counters, taken, 1)

    options = {"launch_bounds": bounds} if bounds and not SIMULATOR else {}

    @cuda.jit(**options)
    def softmax_steal(x, y, rows, cols, counters, partials):
        buf = cuda.shared.array(0, in_t)
        item = cuda.shared.array(1, int32)
        row_pair = cuda.shared.array(2, float32)
        warp_max = cuda.shared.array(W, float32)
        warp_sum = cuda.shared.array(W, float32)
        slab_of = cuda.shared.array(SLOTS, int32)  # the slab each slot holds
        used = cuda.shared.array(1, int32)  # slots taken by this item's warps
        filled = cuda.shared.array(1, int32)
        a = cuda.local.array((U, P), float32)
        w = cuda.local.array((U, NW), uint32)
        wrow = cuda.local.array(NW, uint32)
        tout = cuda.local.array(P, float32)
        tid = uint32(cuda.threadIdx.x)
        lane = uint32(tid % WARP)
        warp = uint32(tid // WARP)
        items = uint32(rows * C)
        last_ticket = uint32(items + cuda.gridDim.x - 1)
        packs = uint32(cols // P)
        slabs = int32((packs + (SLAB - 1)) // SLAB)
        if tid == 0:
            used[0] = 0
        while True:
            if tid == 0:
                t = cuda.atomic.add(counters, 0, 1)
                if t == last_ticket:
                    counters[0] = 0  # every block holds its last ticket: re-arm
                item[0] = t
            cuda.syncthreads()
            t = uint32(item[0])
            if t >= items:
                break
            row = uint32(t // C)
            arrivals = uint32(1 + row)
            taken = uint32(1 + rows + row)

            # Pass 1: slabs into the block's slots, running max and online sum.
            m = NEG_INF
            d = float32(0.0)
            z = int32(SLOTS)
            g = slabs
            if lane == 0:
                z, g = take(used, counters, taken, slabs)
            z = cuda.shfl_sync(FULL_MASK, z, 0)
            g = cuda.shfl_sync(FULL_MASK, g, 0)
            while g < slabs:
                next_z = int32(SLOTS)
                next_g = slabs
                if lane == 0:
                    next_z, next_g = take(used, counters, taken, slabs)
                p = uint32(uint32(g) * SLAB + lane)
                cm = m
                if PACKED:
                    n = load_words(x, row, p, WARP, packs, w)
                    for u in range(U):
                        if u < n:
                            for j in range(NW):
                                wrow[j] = w[u, j]
                                vals = unpack_word(w[u, j], ISZ)
                                for h in range(PW):
                                    a[u, j * PW + h] = vals[h]
                                    cm = max(cm, vals[h])
                            s = uint32(z * SLAB + u * WARP + lane)
                            store_words1(buf, uint32(s * P), wrow, NW)
                else:
                    n = load_packs(x, row, p, WARP, packs, a)
                    for u in range(U):
                        if u < n:
                            s = uint32(z * SLAB + u * WARP + lane)
                            for i in range(P):
                                v = a[u, i]
                                cm = max(cm, v)
                                buf[uint32(i * CAP + s)] = in_t(v)
                m, d = fold(a, n, cm, m, d)
                if lane == 0:
                    slab_of[z] = g
                z = cuda.shfl_sync(FULL_MASK, next_z, 0)
                g = cuda.shfl_sync(FULL_MASK, next_g, 0)
            if lane == 0 and z < SLOTS:
                slab_of[z] = g  # a slot taken after the row ran out: left empty

            # The block's pair: per warp, then warp 0 over the warps' pairs.
            m, d = warp_merge(m, d)
            if lane == 0:
                warp_max[warp] = m
                warp_sum[warp] = d
            cuda.syncthreads()
            if warp == 0:
                m = warp_max[lane] if lane < W else NEG_INF
                d = warp_sum[lane] if lane < W else float32(0.0)
                m, d = warp_merge(m, d)
                if lane == 0:
                    # Every warp is done taking: the slots filled, and a fresh pool.
                    filled[0] = min(used[0], SLOTS)
                    used[0] = 0
                    # Publish the pair and wait for the row's other blocks.
                    partials[uint32(2 * t)] = m
                    partials[uint32(2 * t + 1)] = d
                    cuda.threadfence()
                    cuda.atomic.add(counters, arrivals, 1)
                    while cuda.atomic.add(counters, arrivals, 0) < C:
                        pass
                    cuda.threadfence()
                cuda.syncwarp()
                # The row's pair from its blocks' pairs (read at L2, never a stale line).
                m = NEG_INF
                d = float32(0.0)
                j = lane
                while j < C:
                    o = uint32(2 * (row * C + j))
                    m, d = merge(
                        m,
                        d,
                        cuda.atomic.add(partials, o, float32(0.0)),
                        cuda.atomic.add(partials, uint32(o + 1), float32(0.0)),
                    )
                    j = uint32(j + WARP)
                m, d = warp_merge(m, d)
                if lane == 0:
                    row_pair[0] = m
                    row_pair[1] = d
                    if cuda.atomic.add(counters, arrivals, 1) == 2 * C - 1:
                        # The row's last block out: every warp of the row is done taking.
                        counters[arrivals] = 0
                        counters[taken] = 0
            cuda.syncthreads()
            rmax = row_pair[0]
            rsum = row_pair[1]
            nfilled = int32(filled[0])

            # Pass 2: the filled slots' outputs, slot z by warp z % W.
            lse = math.log(rsum)
            l2s = float32(math.log2(rsum))
            z = int32(warp)
            while z < nfilled:
                gz = slab_of[z]
                z0 = uint32(z)
                z = int32(z + W)
                if gz >= slabs:
                    continue
                first = uint32(uint32(gz) * SLAB)
                for u in range(U):
                    q = uint32(first + u * WARP + lane)
                    if q < packs:
                        s = uint32(z0 * SLAB + u * WARP + lane)
                        if PACKED:
                            pa = load_pack1(buf, uint32(s * P), NBI)
                        for i in range(P):
                            if PACKED:
                                v = pa[i] - rmax
                            else:
                                v = float32(buf[uint32(i * CAP + s)]) - rmax
                            tout[i] = v - lse if log else exp_over(v, l2s)
                        store_pack2(y, row, uint32(q * P), tout, NBO)

    return softmax_steal


def plan_steal(
    rows: int,
    cols: int,
    in_dtype,
    out_dtype,
    pack: int,
    log: bool,
    *,
    block_size: int = 256,
    unroll: int = 4,
    chunks: int | None = None,
    slack: int = 4,
    packed: bool | None = None,
    bounds: tuple | None = None,
):
    """(Plan, SplitLauncher) of the slab-stealing kernel for this shape and pack.

    chunks: blocks per row (default kernels.softmax_split.default_chunks); packed:
    default for 2-byte inputs, as the split path. Raises ValueError when the device
    cannot hold a row's blocks at once (they wait for each other) or cannot launch
    the kernel at all (too much shared memory).
    """
    from .softmax import Plan
    from .softmax_split import SplitLauncher, default_chunks, resident_blocks, signature

    in_dtype, out_dtype = np.dtype(in_dtype), np.dtype(out_dtype)
    if block_size % WARP or not 0 < block_size <= 1024:
        raise ValueError(f"block_size must be a multiple of 32 in 32..1024, got {block_size}")
    packed = in_dtype.itemsize == 2 if packed is None else packed
    packs = cols // pack
    chunks = chunks or default_chunks(cols, pack, in_dtype.itemsize)
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    warps = block_size // WARP
    slots = slots_per_block(packs, unroll, chunks, slack)
    smem = slots * slab_packs(unroll) * pack * in_dtype.itemsize
    kernel = steal_kernel(
        in_dtype, out_dtype, pack, unroll, chunks, warps, slots, bool(log), packed, bounds
    )
    held = resident_blocks(kernel, signature(in_dtype, out_dtype), block_size, smem)
    if held < chunks:
        raise ValueError(
            f"method 'split' cannot run {chunks} blocks of {smem} bytes per row: the device "
            f"holds {held} such blocks at once, and a row's blocks wait for each other"
        )
    grid = min(rows * chunks, held)
    how = Plan("split", pack, grid, (block_size, 1), smem, unroll=unroll, chunks=chunks)
    return how, SplitLauncher(kernel, rows, chunks, counters=1 + 2 * rows)
