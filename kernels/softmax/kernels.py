"""The softmax kernels that hold a row in one warp or one block: `warp_kernel`,
`block_smem_kernel` and `block_uncached_kernel`, each a factory specialised on its
compile-time shape (OneFlow's template arguments) and kept per process.

What each does, and when `kernels.softmax.dispatch` runs which, is in that module's
docstring; the split kernel (a row over several blocks) is `kernels.softmax.split`'s.
Packs are loaded and stored through `kernels.common.packs`, rows reduced through
`kernels.common.reduce`, and the exponentials, pack loader and online normaliser come
from `kernels.softmax.numerics`.
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32, from_dtype, uint32

from ..common.packs import load_pack2, store_pack2
from ..common.reduce import (
    block_allreduce_max,
    block_allreduce_sum,
    group_mask,
    warp_allreduce_max,
    warp_allreduce_sum,
)
from ..common.refs import kernel_factory
from .numerics import NEG_INF, exp32, exp_over, online_folder, pack_loader


@kernel_factory
def warp_kernel(in_dtype, out_dtype, pack, cols_per_thread, width, rows_per_access, padding, log):
    """The warp kernel specialised on its compile-time shape (OneFlow's template args).

    Launch with block (width, WARP_BLOCK // width) on the (rows, cols) input and
    output; packs of `pack` elements are loaded and stored with one 16/8/4/2-byte
    access (kernels.packs).
    """
    NBI = pack * in_dtype.itemsize
    NBO = pack * out_dtype.itemsize
    num_packs = cols_per_thread // pack

    @cuda.jit
    def softmax_warp(x, y, rows, cols):
        buf = cuda.local.array((rows_per_access, cols_per_thread), float32)
        row_max = cuda.local.array(rows_per_access, float32)
        row_sum = cuda.local.array(rows_per_access, float32)
        tout = cuda.local.array(pack, float32)
        lane = cuda.threadIdx.x
        mask = group_mask(width)
        packs = cols // pack
        row = (cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y) * rows_per_access
        step = cuda.gridDim.x * cuda.blockDim.y * rows_per_access
        while row < rows:
            for r in range(rows_per_access):
                m = NEG_INF
                for p in range(num_packs):
                    pc = p * width + lane  # neighbouring lanes read neighbouring packs
                    if not padding or pc < packs:
                        pa = load_pack2(x, uint32(row + r), uint32(pc * pack), NBI)
                        for i in range(pack):
                            v = pa[i]
                            buf[r, p * pack + i] = v
                            m = max(m, v)
                    else:
                        for i in range(pack):
                            buf[r, p * pack + i] = NEG_INF
                row_max[r] = warp_allreduce_max(m, width, mask)
            for r in range(rows_per_access):
                s = float32(0.0)
                for j in range(cols_per_thread):
                    if log:
                        v = buf[r, j] - row_max[r]
                        buf[r, j] = v
                        s += exp32(v)
                    else:
                        v = exp32(buf[r, j] - row_max[r])
                        buf[r, j] = v
                        s += v
                row_sum[r] = warp_allreduce_sum(s, width, mask)
            for r in range(rows_per_access):
                lse = math.log(row_sum[r])
                inv = float32(1.0) / row_sum[r]
                for p in range(num_packs):
                    pc = p * width + lane
                    if not padding or pc < packs:
                        for i in range(pack):
                            v = buf[r, p * pack + i]
                            tout[i] = v - lse if log else v * inv
                        store_pack2(y, uint32(row + r), uint32(pc * pack), tout, NBO)
            row += step

    return softmax_warp


def block_smem_kernel(in_dtype, out_dtype, pack, unroll, log, online=False):
    """The block-per-row kernel with the row cached in dynamic shared memory.

    x, y: the (rows, cols) arrays themselves; packs of `pack` elements are loaded and
    stored with one 16/8/4/2-byte access (kernels.packs), `unroll` packs in flight per
    thread in the load loop. online=False (OneFlow's three passes): the cache holds
    float32 values, pass 2 turns them into exp(x - max) in place. online=True: the
    cache holds the input values in their own dtype (half the shared memory for
    float16), pass 1 also keeps an online sum, and pass 2 computes exp again while
    writing: one pass over shared memory and one barrier phase fewer, two exps per
    element.
    """
    in_t = from_dtype(in_dtype)
    P = pack
    NBI = pack * in_dtype.itemsize
    NBO = pack * out_dtype.itemsize
    U = unroll
    cache_t = in_t if online else float32
    load_packs = pack_loader(P, NBI, U)
    fold = online_folder(P, U)

    @cuda.jit
    def softmax_block_smem(x, y, rows, cols):
        buf = cuda.shared.array(0, cache_t)
        a = cuda.local.array((U, P), float32)
        tout = cuda.local.array(P, float32)
        # Strided loops are `while` loops over uint32 counters: Numba's range() with a
        # runtime step costs a dozen 64-bit instructions per iteration.
        tid = uint32(cuda.threadIdx.x)
        nthreads = uint32(cuda.blockDim.x)
        packs = uint32(cols // P)
        urows = uint32(rows)
        row = uint32(cuda.blockIdx.x)
        while row < urows:
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
                            buf[uint32(i * packs + q)] = cache_t(v)
                            cm = max(cm, v)
                if online:
                    m, d = fold(a, n, cm, m, d)
                else:
                    m = cm
                p = uint32(p + U * nthreads)
            rmax = block_allreduce_max(m)
            if online:
                s = d * exp32(m - rmax) if m > NEG_INF else float32(0.0)
            else:
                # Pass 2: exp(x - max) (or x - max for log) in place; a thread touches
                # only the slots it wrote, so no barrier is needed before.
                s = float32(0.0)
                p = tid
                while p < packs:
                    for i in range(P):
                        c = uint32(i * packs + p)
                        if log:
                            v = buf[c] - rmax
                            buf[c] = v
                            s += exp32(v)
                        else:
                            v = exp32(buf[c] - rmax)
                            buf[c] = v
                            s += v
                    p = uint32(p + nthreads)
            rsum = block_allreduce_sum(s)
            lse = math.log(rsum)
            inv = float32(1.0) / rsum
            l2s = float32(math.log2(rsum))
            # Each thread reads back only the slots it wrote in the first loop, so the
            # next row's first loop needs no barrier before overwriting them.
            p = tid
            while p < packs:
                for i in range(P):
                    v = float32(buf[uint32(i * packs + p)])
                    if online:
                        v = v - rmax
                        tout[i] = v - lse if log else exp_over(v, l2s)
                    else:
                        tout[i] = v - lse if log else v * inv
                store_pack2(y, row, uint32(p * P), tout, NBO)
                p = uint32(p + nthreads)
            row = uint32(row + cuda.gridDim.x)

    return softmax_block_smem


@functools.cache
def block_uncached_kernel(in_dtype, out_dtype, pack, unroll, log):
    """The block-per-row kernel that reads the row from global memory twice.

    Pass 1 keeps, per thread, the running max m and d = sum exp(x - m) (rescaled once
    per group of `unroll` packs when m grows); pass 2 re-reads the row and writes the
    output. Packs and unroll as in block_smem_kernel.
    """
    P = pack
    NBI = pack * in_dtype.itemsize
    NBO = pack * out_dtype.itemsize
    U = unroll
    load_packs = pack_loader(P, NBI, U)
    fold = online_folder(P, U)

    @cuda.jit
    def softmax_block_uncached(x, y, rows, cols):
        a = cuda.local.array((U, P), float32)
        tout = cuda.local.array(P, float32)
        tid = uint32(cuda.threadIdx.x)
        nthreads = uint32(cuda.blockDim.x)
        packs = uint32(cols // P)
        urows = uint32(rows)
        row = uint32(cuda.blockIdx.x)
        while row < urows:
            # Online normaliser: d is this thread's sum of exp(x - m) for its running
            # max m, rescaled whenever m grows, so one pass gives both.
            m = NEG_INF
            d = float32(0.0)
            p = tid
            while p < packs:
                n = load_packs(x, row, p, nthreads, packs, a)
                cm = m
                for u in range(U):
                    if u < n:
                        for i in range(P):
                            cm = max(cm, a[u, i])
                m, d = fold(a, n, cm, m, d)
                p = uint32(p + U * nthreads)
            rmax = block_allreduce_max(m)
            s = d * exp32(m - rmax) if m > NEG_INF else float32(0.0)
            rsum = block_allreduce_sum(s)
            lse = math.log(rsum)
            l2s = float32(math.log2(rsum))
            p = tid
            while p < packs:
                n = load_packs(x, row, p, nthreads, packs, a)
                for u in range(U):
                    if u < n:
                        for i in range(P):
                            v = a[u, i] - rmax
                            tout[i] = v - lse if log else exp_over(v, l2s)
                        store_pack2(y, row, uint32((p + u * nthreads) * P), tout, NBO)
                p = uint32(p + U * nthreads)
            row = uint32(row + cuda.gridDim.x)

    return softmax_block_uncached
