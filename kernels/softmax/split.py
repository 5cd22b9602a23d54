"""Softmax of rows too wide for one block's shared memory, read from global memory once.

`split` path of kernels.softmax.dispatch. A row is cut into `chunks` consecutive pieces of
`span` packs; each piece is one work item, handled by one block that keeps it in
dynamic shared memory (in the input dtype). The blocks of a row exchange their
partial results through global memory:

1. Thread 0 takes a ticket (an atomic counter): item t is chunk t % chunks of row
   t // chunks. Tickets, not blockIdx, name the work, so items are taken in the
   order blocks actually start.
2. The block loads its chunk into shared memory, keeping per thread the running max
   and an online sum of exp (as block_uncached), and reduces them to the chunk's
   (max, sum of exp(x - max)).
3. Thread 0 publishes that pair as one int64 (`int_ops.pair_bits`) by one atomic
   add into the chunk's slot of `partials` (zero until then, so the add stores the
   pair; a published pair is never (+0.0, 0.0), since a finite max has a sum >= 1
   and -inf or NaN maxima have non-zero bits), so the pair is its own arrival flag
   and needs no fence. An add, not an exchange, because the readers' atomic reads
   are adds too: Numba's simulator guards each atomic operation with its own lock,
   so an exchange could land between a reader's read and write-back and be lost.
4. Warp 0's lanes read the row's slots (atomically, so at L2: never a stale L1
   line), each spinning until its slot is published, and combine them into the
   row's max and sum; the block writes its chunk's outputs from shared memory:
   exp(x - max) / sum, or x - max - log(sum).

With two stages (auto's), a block has two buffers and does step 4 for the item it
loaded the round before: take a ticket, load and publish item t into one buffer,
then wait for the row of the previous item and write it from the other. The wait
for a row's slowest chunk, 4.5 us of a 16 us item with one buffer (float16 131072
columns, traced by `benchmarks/trace_split.py`), is spent loading.

A pair that is its own arrival flag (step 3) puts one L2 round trip between a row's
last load and its writes, against about four for two float32 stores, a fence and an
arrival counter to spin on. H100, float16 131072 columns: 88.4% of copy against
85.0% at 8 chunks of 32 KiB (BENCHMARKS.md, Softmax).

Forward progress: a block only waits for blocks of its own row, after publishing
every item it holds. Tickets are taken in order, so only the row holding the
newest ticket can have chunks nobody took yet; a deadlock would need every resident
block to be waiting in that one row, holding at most chunks - 1 of its tickets (one
a block with one buffer, two with two). So the kernel completes whenever the device
can hold at least `chunks` of its blocks at once, which plan_split checks (CUDA
occupancy calculator; Numba's simulator answers 1 there, so the path is refused on
it unless a test makes it run blocks concurrently).

The scratch re-arms itself: the block taking the last ticket zeroes the ticket
counter, and the last of a row's blocks to read the row's pairs (a per-row
counter) zeroes them and the counter after its writes, so consecutive launches
need no memset. Two launches running at once (on two streams) must not share the
scratch, so a launcher keeps one per stream (`SplitLauncher.scratch`), created zeroed
by a memset queued on that stream; launches on one stream run one after another.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading

import numpy as np
from numba import config as _numba_config
from numba import cuda, float32, from_dtype, int32, int64, types, uint32

from ..common.arrays import as_device_array, empty, resolve_stream, to_device
from ..common.devarray import PER_THREAD
from ..common.int_ops import pair_bits, pair_of
from ..common.launch import (
    allow_dynamic_smem,
    cdiv,
    largest_block_keeping_occupancy,
    launch,
    under_compile_lock,
)
from ..common.packs import load_pack1, store_pack2, store_words1, unpack_word
from .numerics import exp32, exp_over, online_folder, pack_loader
from .plan import Plan

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)
NEG_INF = float32(-math.inf)
FULL_MASK = 0xFFFFFFFF
# auto's geometry, both dtypes: pieces of at most SPLIT_CHUNK_BYTES, two buffers a
# block, SPLIT_BLOCK threads, SPLIT_UNROLL packs in flight, launch bounds for
# SPLIT_BLOCKS_PER_SM blocks per SM (40 registers). H100, 2^26 elements of 131072
# columns (`benchmarks/sweep_softmax_split.py`): float16 16 chunks 93.8-94.0% of copy,
# float32 32 chunks 97.5-97.6%. Against the alternatives, measured with the pair
# published by an exchange (this geometry then 91.7-92.4% and 95.8-96.5%): one buffer a
# block (8 chunks of 32 KiB float16 at 256 threads, 8 of 64 KiB float32 at 512)
# 90.5-90.7% and 95.1-95.2%; two buffers with 128 or 192 threads a block, 1 or 4 packs
# in flight, 12, 20, 24 or 32 chunks: 84.0-90.9%.
SPLIT_CHUNK_BYTES = 16 * 1024
SPLIT_BLOCK, SPLIT_UNROLL, SPLIT_BLOCKS_PER_SM, SPLIT_STAGES = 256, 2, 6, 2
BLOCK_SIZES = (128, 256, 512, 1024)


@functools.cache
def split_kernel(
    in_dtype,
    out_dtype,
    pack: int,
    unroll: int,
    chunks: int,
    log: bool,
    packed: bool = False,
    bounds: tuple | None = None,
    stages: int = SPLIT_STAGES,
):
    """The split-row kernel for one (dtypes, pack, unroll, chunks, log) combination.

    Launch with any grid of blocks the device holds at once (at most rows * chunks
    are useful), a 1-D block of a multiple of 32 threads and `stages * span * pack *
    itemsize(in)` bytes of dynamic shared memory (span = ceil((cols // pack) /
    chunks)), as `kernel(x, y, rows, cols, counters, partials)`: counters an int32
    array of 1 + rows zeros and partials an int64 array of rows * chunks zeros
    (both left zeroed again on exit). packed: the piece is cached as the raw words
    of whole packs (one vector store and load per pack; packs of 4 bytes or more),
    else element by element (element i of local pack q at i * span + q). bounds: CUDA
    launch bounds (threads, blocks per SM) asked of the compiler. stages: 1, a block
    writes an item's outputs before taking the next; 2, it loads the next item into
    a second buffer first, and only then waits for the previous item's row.
    """
    in_t = from_dtype(np.dtype(in_dtype))
    P, U, C, S = pack, unroll, chunks, stages
    if S not in (1, 2):
        raise ValueError(f"stages must be 1 or 2, got {stages}")
    NBI = pack * np.dtype(in_dtype).itemsize
    NBO = pack * np.dtype(out_dtype).itemsize
    PACKED = packed and NBI >= 4
    NW = max(1, NBI // 4)  # raw words per pack (packed)
    PW = P // NW  # elements per word
    ISZ = np.dtype(in_dtype).itemsize
    load_packs = pack_loader(P, NBI, U)
    load_words = pack_loader(P, NBI, U, raw=PACKED)  # called where PACKED only
    fold = online_folder(P, U)
    fold_words = online_folder(P, U, ISZ)  # called where PACKED only

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
    def row_pair_of(partials, first):
        """The row's pair from its chunks' published pairs partials[first .. first +
        C), waiting for each to be published (nonzero: a published pair is never
        (+0.0, 0.0), as a finite max's sum is at least 1). Every lane of the calling
        warp gets it. Atomic reads: at L2, never a stale L1 line."""
        m = NEG_INF
        d = float32(0.0)
        j = uint32(cuda.threadIdx.x % 32)
        while j < C:
            k = uint32(first + j)
            v = cuda.atomic.add(partials, k, int64(0))
            while v == 0:
                v = cuda.atomic.add(partials, k, int64(0))
            om, od = pair_of(v)
            m, d = merge(m, d, om, od)
            j = uint32(j + 32)
        return warp_merge(m, d)

    @cuda.jit(device=True, inline="always")
    def item_range(t, span, packs):
        """(row, first pack, end pack) of item t: chunk t % C of row t // C."""
        row = uint32(t // C)
        start = uint32(min((t - row * C) * span, packs))
        return row, start, uint32(min(start + span, packs))

    @cuda.jit(device=True, inline="always")
    def load_chunk(x, buf, base, row, start, end, span, a, w, wrow):
        """Pass 1: packs start .. end of x's row into buf from base (a thread's slots
        are the local packs q = tid (mod nthreads)); this thread's running max and
        online sum of exp."""
        tid = uint32(cuda.threadIdx.x)
        nthreads = uint32(cuda.blockDim.x)
        m = NEG_INF
        d = float32(0.0)
        p = uint32(start + tid)
        while p < end:
            cm = m
            if PACKED:
                # Raw words into shared memory; the values are unpacked from the words
                # where used (not kept: U packs of float32 would double the registers).
                n = load_words(x, row, p, nthreads, end, w)
                for u in range(U):
                    if u < n:
                        for k in range(NW):
                            wrow[k] = w[u, k]
                            vals = unpack_word(w[u, k], ISZ)
                            for h in range(PW):
                                cm = max(cm, vals[h])
                        q = uint32(p - start + u * nthreads)
                        store_words1(buf, uint32(base + q * P), wrow, NW)
                m, d = fold_words(w, n, cm, m, d)
            else:
                n = load_packs(x, row, p, nthreads, end, a)
                for u in range(U):
                    if u < n:
                        q = uint32(p - start + u * nthreads)
                        for i in range(P):
                            v = a[u, i]
                            cm = max(cm, v)
                            buf[uint32(base + i * span + q)] = in_t(v)
                m, d = fold(a, n, cm, m, d)
            p = uint32(p + U * nthreads)
        return m, d

    @cuda.jit(device=True, inline="always")
    def write_chunk(y, buf, base, row, start, end, span, rmax, rsum, tout):
        """Pass 2: the outputs of packs start .. end of y's row from buf (as
        load_chunk left it), given the row's max and sum of exp(x - max)."""
        tid = uint32(cuda.threadIdx.x)
        nthreads = uint32(cuda.blockDim.x)
        lse = math.log(rsum)
        l2s = float32(math.log2(rsum))
        q = tid
        while q < end - start:
            if PACKED:
                pa = load_pack1(buf, uint32(base + q * P), NBI)
            for i in range(P):
                if PACKED:
                    v = pa[i] - rmax
                else:
                    v = float32(buf[uint32(base + i * span + q)]) - rmax
                tout[i] = v - lse if log else exp_over(v, l2s)
            store_pack2(y, row, uint32((start + q) * P), tout, NBO)
            q = uint32(q + nthreads)

    options = {"launch_bounds": bounds} if bounds and not SIMULATOR else {}

    @cuda.jit(**options)
    def softmax_split(x, y, rows, cols, counters, partials):
        buf = cuda.shared.array(0, in_t)
        # Shared slots: the block's ticket, the row's (max, sum), the warps' pairs.
        item = cuda.shared.array(1, int32)
        row_pair = cuda.shared.array(2, float32)
        warp_max = cuda.shared.array(32, float32)
        warp_sum = cuda.shared.array(32, float32)
        a = cuda.local.array((U, P), float32)
        w = cuda.local.array((U, NW), uint32)
        wrow = cuda.local.array(NW, uint32)
        tout = cuda.local.array(P, float32)
        tid = uint32(cuda.threadIdx.x)
        lane = uint32(tid % 32)
        warp = uint32(tid // 32)
        nthreads = uint32(cuda.blockDim.x)
        items = uint32(rows * C)
        # Each block takes one ticket per item plus one past the last item: the block
        # taking ticket items + gridDim.x - 1 is the last to take one.
        last_ticket = uint32(items + cuda.gridDim.x - 1)
        packs = uint32(cols // P)
        span = uint32((packs + (C - 1)) // C)
        piece = uint32(span * P)  # elements of one buffer
        readers = int32(0)
        load_base = uint32(0)  # where the next load goes in buf (S = 2: alternates)
        held = uint32(items)  # S = 2: the item loaded last round (items: none) ...
        held_base = uint32(0)  # ... and where
        while True:
            # A ticket is taken when the block is ready to load: the chunks of a row go
            # to the next blocks to be free, so they arrive close together. (Taking it
            # before the previous item's pass 2 was measured 15% slower, and 9% slower
            # again with the int64 exchange.)
            if tid == 0:
                t = cuda.atomic.add(counters, 0, 1)
                if t == last_ticket:
                    counters[0] = 0  # every block holds its last ticket: re-arm
                item[0] = t
            cuda.syncthreads()
            t = uint32(item[0])

            if t < items:
                # Pass 1 of item t, then its pair: per warp, warp 0 over the warps'
                # pairs, published in one atomic (the pair is its own flag: no fence).
                row, start, end = item_range(t, span, packs)
                m, d = load_chunk(x, buf, load_base, row, start, end, span, a, w, wrow)
                m, d = warp_merge(m, d)
                if lane == 0:
                    warp_max[warp] = m
                    warp_sum[warp] = d
                cuda.syncthreads()
                if warp == 0:
                    nwarps = nthreads // 32
                    m = warp_max[lane] if lane < nwarps else NEG_INF
                    d = warp_sum[lane] if lane < nwarps else float32(0.0)
                    m, d = warp_merge(m, d)
                    if lane == 0:
                        cuda.atomic.add(partials, t, pair_bits(m, d))

            # The item whose outputs are due: t itself (S = 1), else the one loaded
            # last round, whose row's other chunks had this round's load to arrive.
            due = t if S == 1 else held
            due_base = load_base if S == 1 else held_base
            if due < items:
                row, start, end = item_range(due, span, packs)
                slot = uint32(1 + row)
                if warp == 0:
                    # Combine the row's pairs as they arrive; count this block's reads
                    # (the count is read after pass 2: its latency off the path).
                    m, d = row_pair_of(partials, uint32(row * C))
                    if lane == 0:
                        row_pair[0] = m
                        row_pair[1] = d
                        readers = cuda.atomic.add(counters, slot, 1)
                cuda.syncthreads()
                write_chunk(y, buf, due_base, row, start, end, span, row_pair[0], row_pair[1], tout)
                if warp == 0:
                    if cuda.shfl_sync(FULL_MASK, readers, 0) == C - 1:
                        # Every block of the row has read its pairs: zero them and the
                        # count.
                        j = lane
                        while j < C:
                            partials[uint32(row * C + j)] = 0
                            j = uint32(j + 32)
                        if lane == 0:
                            counters[slot] = 0
            if t >= items:
                break
            held = t
            held_base = load_base
            if S == 2:
                load_base = uint32(piece - load_base)

    return softmax_split


def signature(in_dtype, out_dtype) -> tuple:
    """The Numba signature split_kernel's kernels are launched with."""
    arr = types.Array
    return (
        arr(from_dtype(np.dtype(in_dtype)), 2, "C"),
        arr(from_dtype(np.dtype(out_dtype)), 2, "C"),
        types.int64,
        types.int64,
        arr(types.int32, 1, "C"),
        arr(types.int64, 1, "C"),
    )


def resident_blocks(kernel, sig: tuple, block: int, smem: int) -> int:
    """How many blocks of `kernel` (`block` threads, `smem` dynamic shared bytes) the
    device holds at once: occupancy per SM times the SMs (0: cannot launch). On the
    simulator, its own answer to max_cooperative_grid_blocks (1: it runs blocks one
    after another)."""
    if SIMULATOR:
        return int(kernel.overloads[sig].max_cooperative_grid_blocks(block))
    compiled = kernel.compile(sig)
    if not allow_dynamic_smem(compiled, smem):
        return 0
    return int(compiled.max_cooperative_grid_blocks(block, smem))


def default_chunks(cols: int, pack: int, itemsize: int) -> int:
    """Chunks per row under `auto`: pieces of at most SPLIT_CHUNK_BYTES, at least 2,
    at most one per pack."""
    packs = cols // pack
    return max(1, min(packs, max(2, cdiv(cols * itemsize, SPLIT_CHUNK_BYTES))))


def split_unroll(span: int, block: int) -> int:
    """Packs in flight per thread: as block_uncached's rule (uncached_unroll)."""
    per_thread = span // block
    return 4 if per_thread >= 8 else 2 if per_thread >= 2 else 1


SCRATCH_KEEP = 32  # streams whose scratch a launcher keeps (the oldest goes first)
_THREAD = threading.local()
_TOKENS = itertools.count()


def _thread_token() -> int:
    """A number for the calling thread, never reused (thread idents are, once a
    thread ends; its per-thread stream's work may still be running)."""
    token = getattr(_THREAD, "token", None)
    if token is None:
        token = _THREAD.token = next(_TOKENS)
    return token


def _zeros(n: int, dtype, stream: int):
    """A zeroed device array of n elements, zeroed in `stream`'s order (a memset
    queued there; on the simulator a copy of host zeros)."""
    if SIMULATOR:
        return to_device(np.zeros(n, dtype), stream)
    from ..common.cudadrv import driver

    arr = empty((n,), dtype, stream)
    driver().memset(arr.ptr, 0, arr.nbytes, stream)
    return arr


class SplitLauncher:
    """split_kernel with its scratch, made for one row count. `launch(x, y, rows,
    cols, grid, block, smem, stream)` queues it through kernels.common.launch.launch with
    the scratch of `stream` (`scratch(stream)`); `launcher[grid, block, stream,
    smem](x, y, rows, cols)` does the same, Numba-style, for any device arrays.

    Scratch per stream: the counters and pairs are zero between launches and every
    completed launch leaves them zeroed, but two launches running at once would mix
    their tickets and pairs, so each stream (each thread's, for the per-thread
    default stream) gets its own, created on first use by a memset queued on that
    stream. Up to SCRATCH_KEEP streams are kept; dropping the oldest is safe (its
    memory goes back to the pool of its stream, reused only after that stream's
    queued work). Thread-safe."""

    def __init__(self, kernel, rows: int, chunks: int):
        self.kernel = kernel
        self.rows = rows
        self.chunks = chunks
        self._scratch: dict = {}
        self._lock = threading.Lock()

    def scratch(self, stream: int = 0) -> tuple:
        """(counters, partials) device arrays for launches on `stream` (a CUstream
        handle): 1 + rows int32 and rows * chunks int64, zero between launches."""
        key = (stream, _thread_token()) if stream == PER_THREAD else stream
        pair = self._scratch.get(key)
        if pair is None:
            with self._lock:
                pair = self._scratch.get(key)
                if pair is None:
                    pair = (
                        _zeros(1 + self.rows, np.int32, stream),
                        _zeros(self.rows * self.chunks, np.int64, stream),
                    )
                    if len(self._scratch) >= SCRATCH_KEEP:
                        self._scratch.pop(next(iter(self._scratch)))
                    self._scratch[key] = pair
        return pair

    def launch(self, x, y, rows: int, cols: int, grid, block, smem: int, stream: int = 0):
        """Queue the kernel on x, y (launchable arrays: kernels.common.arrays) and return."""
        if rows != self.rows:
            raise ValueError(f"this split launcher is for {self.rows} rows, got {rows}")
        counters, partials = self.scratch(stream)
        launch(self.kernel, grid, block, (x, y, rows, cols, counters, partials), stream, smem)

    def __getitem__(self, config):
        grid, block, *rest = config
        handle = resolve_stream(rest[0] if rest else None)
        smem = int(rest[1]) if len(rest) > 1 else 0

        def run(x, y, rows: int, cols: int) -> None:
            self.launch(as_device_array(x), as_device_array(y), int(rows), int(cols), grid,
                        block, smem, handle)  # fmt: skip

        return run


@under_compile_lock
def plan_split(
    rows: int,
    cols: int,
    in_dtype,
    out_dtype,
    pack: int,
    log: bool,
    *,
    block_size: int | None = None,
    unroll: int | None = None,
    chunks: int | None = None,
    packed: bool | None = None,
    bounds: tuple | None = None,
    stages: int | None = None,
):
    """(Plan, SplitLauncher) of the split path for this shape and pack.

    Defaults: `chunks` from default_chunks; when none of block_size, unroll and
    bounds is given, SPLIT_BLOCK threads, SPLIT_UNROLL packs in flight and launch
    bounds for SPLIT_BLOCKS_PER_SM blocks per SM (measured: see SPLIT_CHUNK_BYTES),
    else the block size by OneFlow's occupancy rule (the largest of 128..1024 keeping
    the most blocks resident) and `unroll` from split_unroll. `stages`: buffers a
    block (split_kernel); by default SPLIT_STAGES where the device holds a row's
    blocks with that many buffers each, else 1. `packed` for 2-byte inputs only (H100,
    131072 columns at auto's geometry, `benchmarks/sweep_softmax_split.py`: float16
    91.7-92.0% of copy packed, 81.7% not; float32 96.9% packed, 95.8-96.5% not). Raises
    ValueError when chunks is not in 1..cols // pack, or when the device cannot hold a
    row's `chunks` blocks at once (the kernel could deadlock), or cannot launch it at
    all.
    """
    in_dtype, out_dtype = np.dtype(in_dtype), np.dtype(out_dtype)
    packed = in_dtype.itemsize == 2 if packed is None else packed
    if block_size is None and unroll is None and bounds is None:
        block_size, unroll, bounds = SPLIT_BLOCK, SPLIT_UNROLL, (SPLIT_BLOCK, SPLIT_BLOCKS_PER_SM)
    packs = cols // pack
    if chunks is None:
        chunks = default_chunks(cols, pack, in_dtype.itemsize)
    if not 1 <= chunks <= packs:
        raise ValueError(f"chunks must be in 1..{packs} (packs per row), got {chunks}")
    span = cdiv(packs, chunks)
    sizes = (block_size,) if block_size else BLOCK_SIZES
    unroll = unroll or split_unroll(span, block_size or 256)
    sig = signature(in_dtype, out_dtype)
    for buffers in (stages,) if stages else (SPLIT_STAGES, 1):
        smem = buffers * span * pack * in_dtype.itemsize
        kernel = split_kernel(
            in_dtype, out_dtype, pack, unroll, chunks, bool(log), packed, bounds, buffers
        )
        held = {size: resident_blocks(kernel, sig, size, smem) for size in sizes}
        size = largest_block_keeping_occupancy(held.get, sizes)
        if size and held[size] >= chunks:
            grid = min(rows * chunks, held[size])
            how = Plan(
                "split", pack, grid, (size, 1), smem, unroll=unroll, chunks=chunks,
                stages=buffers,
            )  # fmt: skip
            return how, SplitLauncher(kernel, rows, chunks)
    raise ValueError(
        f"method 'split' cannot run {chunks} chunks of {smem} bytes: the device holds "
        f"{held[size or sizes[0]]} such blocks at once, and a row's blocks wait for "
        "each other"
    )
