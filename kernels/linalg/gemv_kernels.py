"""GEMV's kernels (Numba CUDA); `kernels.linalg.gemv` plans and launches them.

Importing this module imports Numba: `kernels.linalg.gemv` names these kernels by
`kernels.common.refs.KernelRef` and imports it only where a kernel does not ship.
"""

from __future__ import annotations

from numba import cuda, float32, uint32

from ..common.packs import load_pack1, load_pack2
from ..common.reduce import WARP, group_mask, warp_allreduce_sum
from ..common.refs import kernel_factory

MAX_BLOCK_N = 64  # rows per block: the size of the atomic paths' shared slots


@cuda.jit(cache=True)
def gemv_naive(A, x, y):
    """One thread per row of A, a serial float32 sum over K."""
    r = cuda.grid(1)
    if r < A.shape[0]:
        ur = uint32(r)
        acc = float32(0.0)
        for k in range(A.shape[1]):
            uk = uint32(k)
            acc += float32(A[ur, uk]) * float32(x[uk])
        y[ur] = acc


@cuda.jit(cache=True)
def gemv_splitk(A, x, y):
    """reduce_threads (blockDim.x) lanes per row, block_n (blockDim.y) rows per block,
    scalar loads, partial sums combined by atomic adds to shared memory."""
    slot = cuda.shared.array(MAX_BLOCK_N, float32)
    tk = cuda.threadIdx.x
    tn = cuda.threadIdx.y
    rt = cuda.blockDim.x
    r = cuda.blockIdx.x * cuda.blockDim.y + tn
    if tk == 0:
        slot[tn] = float32(0.0)
    cuda.syncthreads()
    if r < A.shape[0]:
        ur = uint32(r)
        acc = float32(0.0)
        for k in range(tk, A.shape[1], rt):
            uk = uint32(k)
            acc += float32(A[ur, uk]) * float32(x[uk])
        cuda.atomic.add(slot, tn, acc)
    cuda.syncthreads()
    if tk == 0 and r < A.shape[0]:
        y[uint32(r)] = slot[tn]


@kernel_factory
def packed_kernel(nbytes: int, itemsize: int, unroll: int, tree: bool):
    """The vectorized (tree=False: atomics) or tree kernel for packs of nbytes.

    Compile-time (closure ints, so Numba's on-disk cache keys on them): pack bytes,
    unroll, reduction. Launch-time: block (reduce_threads, block_n), grid
    cdiv(N, block_n).
    """
    NB = nbytes
    P = nbytes // itemsize  # elements per pack
    U = unroll
    TREE = tree

    @cuda.jit(cache=True)
    def gemv_packed(A, x, y):
        """Lanes tk < rt of row r = blockIdx.x * block_n + tn: pack loads, then a
        shuffle tree (TREE) or shared-memory atomics combine the lanes' sums."""
        slot = cuda.shared.array(MAX_BLOCK_N, float32)
        partial = cuda.shared.array(WARP, float32)
        a = cuda.local.array((U, P), float32)
        b = cuda.local.array((U, P), float32)
        tk = cuda.threadIdx.x
        tn = cuda.threadIdx.y
        rt = cuda.blockDim.x
        r = cuda.blockIdx.x * cuda.blockDim.y + tn
        n = A.shape[0]
        K = A.shape[1]
        if not TREE:
            if tk == 0:
                slot[tn] = float32(0.0)
            cuda.syncthreads()
        acc = float32(0.0)
        if r < n:
            ur = uint32(r)
            packs = K // P
            v = tk
            # Main loop: U packs per lane per step, all loads issued before the FMAs.
            while v + (U - 1) * rt < packs:
                for u in range(U):
                    c = uint32((v + u * rt) * P)
                    pa = load_pack2(A, ur, c, NB)
                    pb = load_pack1(x, c, NB)
                    for i in range(P):
                        a[u, i] = pa[i]
                        b[u, i] = pb[i]
                for u in range(U):
                    for i in range(P):
                        acc += a[u, i] * b[u, i]
                v += U * rt
            while v < packs:
                c = uint32(v * P)
                pa = load_pack2(A, ur, c, NB)
                pb = load_pack1(x, c, NB)
                for i in range(P):
                    acc += pa[i] * pb[i]
                v += rt
            # Scalar tail: the K % P elements past the last whole pack.
            for k in range(packs * P + tk, K, rt):
                uk = uint32(k)
                acc += float32(A[ur, uk]) * float32(x[uk])
        if not TREE:
            if r < n:
                cuda.atomic.add(slot, tn, acc)
            cuda.syncthreads()
            if tk == 0 and r < n:
                y[uint32(r)] = slot[tn]
        elif rt <= WARP:
            # A row's lanes are an aligned group of rt lanes inside one warp.
            acc = warp_allreduce_sum(acc, rt, group_mask(rt))
            if tk == 0 and r < n:
                y[uint32(r)] = acc
        else:
            warps = rt // WARP  # whole warps per row; block_n * warps <= 32
            acc = warp_allreduce_sum(acc, WARP, uint32(0xFFFFFFFF))
            if tk % WARP == 0:
                partial[tn * warps + tk // WARP] = acc
            cuda.syncthreads()
            if tk < warps:
                acc = warp_allreduce_sum(partial[tn * warps + tk], warps, group_mask(warps))
                if tk == 0 and r < n:
                    y[uint32(r)] = acc

    return gemv_packed
