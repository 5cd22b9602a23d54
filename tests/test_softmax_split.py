"""kernels.softmax's `split` path (kernels.softmax.split) against float64 NumPy.

The kernel's blocks wait for each other (a row's chunks combine through global
memory), which Numba's simulator cannot run: it runs a grid's blocks one after
another, with one shared memory for all of them, and says it holds one block at a
time (max_cooperative_grid_blocks is 1, so plan() refuses `split` there). On the
simulator these tests run under `concurrent_blocks`, a shim that makes it schedule
blocks as a GPU does (see its docstring); tests marked `gpu` run full-size shapes
on a real device.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time

import numpy as np
import pytest
from numba import cuda
from test_softmax import check, random_rows, reference, special_rows

from kernels.common import arrays
from kernels.common.launch import cdiv
from kernels.softmax import dispatch as sm
from kernels.softmax import softmax
from kernels.softmax import split as ss
from kernels.softmax.dispatch import plan

SLOT_TIMEOUT_S = 120.0  # a launch waiting this long for a block slot is deadlocked


@contextlib.contextmanager
def concurrent_blocks(resident: int):
    """Run simulated launches as a GPU's block scheduler does (simulator only).

    Blocks start in blockIdx order, each as soon as one of `resident` slots is free,
    and run concurrently (each block's threads are the simulator's threads, as
    before); each block gets its own shared memory (the simulator keeps one per
    launch); the kernel overloads' max_cooperative_grid_blocks answers `resident`,
    the device's "blocks held at once". Global memory, atomics (under the
    simulator's locks) and fences (no-ops: Python threads see every store in
    order) are the simulator's own. A launch returns when all its blocks have
    finished; the first exception of any block is raised then. A launch that waits
    SLOT_TIMEOUT_S for a free slot, or for its blocks to finish, raises (its blocks
    deadlocked).
    """
    from numba.cuda.simulator import kernel as sim_kernel
    from numba.cuda.simulator import kernelapi

    base = sim_kernel.BlockManager
    launch: dict = {}
    lock = threading.Lock()

    class ConcurrentBlockManager(base):
        def run(self, grid_point, *args):
            if not any(grid_point):
                launch.update(slots=threading.Semaphore(resident), threads=[], errors=[])
            if not launch["slots"].acquire(timeout=SLOT_TIMEOUT_S):
                raise RuntimeError(f"no block slot freed in {SLOT_TIMEOUT_S} s: deadlock")

            def block():
                try:
                    base.run(self, grid_point, *args)
                except BaseException as exc:  # handed to the launching thread
                    launch["errors"].append(exc)
                finally:
                    launch["slots"].release()

            thread = threading.Thread(target=block, daemon=True)
            thread.start()
            launch["threads"].append(thread)
            if all(g == n - 1 for g, n in zip(grid_point, self._grid_dim, strict=True)):
                deadline = time.monotonic() + SLOT_TIMEOUT_S
                for thread in launch["threads"]:
                    while thread.is_alive() and time.monotonic() < deadline:
                        if launch["errors"]:
                            break  # its row's other blocks may wait forever
                        thread.join(0.05)
                    if launch["errors"]:
                        raise launch["errors"][0]
                    if thread.is_alive():
                        raise RuntimeError(f"blocks still running after {SLOT_TIMEOUT_S} s")

    atomic_add = kernelapi.FakeCUDAAtomic.add

    def yielding_atomic_add(self, array, index, val):
        old = atomic_add(self, array, index, val)
        time.sleep(0)  # a thread spinning on an atomic lets the others run, as on a GPU
        return old

    def block_shared(module):
        manager = threading.current_thread()._manager
        with lock:
            shared = manager.__dict__.get("_shim_shared")
            if shared is None:
                size = module._shared._dynshared_size
                shared = manager._shim_shared = kernelapi.FakeCUDAShared(size)
        return shared

    def held(self, blockdim, dynsmemsize=0):
        return resident

    saved = (sim_kernel.BlockManager, kernelapi.FakeCUDAModule.shared)
    saved_swap = sim_kernel.swapped_cuda_module
    saved_held = sim_kernel.FakeOverload.max_cooperative_grid_blocks
    sm._PLANS.clear()  # plans made under the shim must not outlive it
    sim_kernel.BlockManager = ConcurrentBlockManager
    kernelapi.FakeCUDAAtomic.add = yielding_atomic_add
    kernelapi.FakeCUDAModule.shared = property(block_shared)
    sim_kernel.FakeOverload.max_cooperative_grid_blocks = held
    if not hasattr(kernelapi, "_swap_refcount"):
        sim_kernel.swapped_cuda_module = _refcounted_swap()
    try:
        yield
    finally:
        sim_kernel.BlockManager, kernelapi.FakeCUDAModule.shared = saved
        sim_kernel.swapped_cuda_module = saved_swap
        sim_kernel.FakeOverload.max_cooperative_grid_blocks = saved_held
        kernelapi.FakeCUDAAtomic.add = atomic_add
        sm._PLANS.clear()


def _refcounted_swap():
    """swapped_cuda_module as newer simulators have it (numba-cuda 0.21's restores a
    module's `cuda` when any thread leaves a device function, under threads of other
    blocks still inside it): the fake module stays in place while any thread is in."""
    from numba import cuda

    registry = threading.Lock()
    locks: dict = collections.defaultdict(threading.Lock)
    counts: dict = collections.defaultdict(int)
    originals: dict = {}

    @contextlib.contextmanager
    def swapped_cuda_module(fn, fake_cuda_module):
        globs = fn.__globals__
        key = id(globs)
        with registry:
            lock = locks[key]
        with lock:
            if counts[key] == 0:
                originals[key] = {k: v for k, v in globs.items() if v is cuda}
                globs.update(dict.fromkeys(originals[key], fake_cuda_module))
            counts[key] += 1
        try:
            yield
        finally:
            with lock:
                counts[key] -= 1
                if counts[key] == 0:
                    globs.update(originals.pop(key))

    return swapped_cuda_module


SIM = bool(ss.SIMULATOR)
sim_only = pytest.mark.skipif(not SIM, reason="simulator shim")


def run_split(x, log=False, resident=64, stages=None, **kw):
    """softmax(x, method="split", block_size=32 on the simulator, ...) under the shim;
    stages given: the same plan's pack, block and chunks with that many buffers."""
    if SIM:
        kw.setdefault("block_size", 32)
    rows, cols = x.shape
    dx, dy = cuda.to_device(x), cuda.device_array(x.shape, x.dtype)
    with concurrent_blocks(resident) if SIM else contextlib.nullcontext():
        how, launcher = plan(rows, cols, x.dtype, log=log, method="split", **kw)
        if stages is not None:
            how, launcher = ss.plan_split(
                rows, cols, x.dtype, x.dtype, how.pack, log, block_size=how.block[0],
                chunks=how.chunks, stages=stages,
            )  # fmt: skip
        assert how.method == "split" and 1 <= how.grid <= rows * how.chunks
        if SIM:  # persistent blocks: as many as are resident, at most one per item
            assert how.grid == min(rows * how.chunks, resident)
        launcher[how.grid, how.block, 0, how.smem](dx, dy, rows, cols)
    return dy.copy_to_host(), how, launcher


# ------------------------------------------------------------------------- the shim


@cuda.jit
def _neighbours(out, flags):
    """Block b waits for block b + 1's flag: runs only if blocks run concurrently.
    Also checks shared memory is per block (each block reads back its own value)."""
    b = cuda.blockIdx.x
    own = cuda.shared.array(1, np.int32)
    if cuda.threadIdx.x == 0:
        own[0] = b
        cuda.atomic.add(flags, b, 1)
        if b + 1 < cuda.gridDim.x:
            while cuda.atomic.add(flags, b + 1, 0) == 0:
                pass
    cuda.syncthreads()
    out[b, cuda.threadIdx.x] = own[0]


@sim_only
def test_shim_runs_blocks_concurrently_with_their_own_shared_memory():
    out = np.full((6, 4), -1, np.int64)
    flags = np.zeros(6, np.int32)
    with concurrent_blocks(resident=6):
        _neighbours[6, 4](out, flags)
    assert (out == np.arange(6)[:, None]).all()


@sim_only
def test_shim_reports_residency_and_restores_the_simulator():
    sig = ss.signature(np.float32, np.float32)
    kernel = ss.split_kernel(np.dtype(np.float32), np.dtype(np.float32), 1, 1, 2, False)
    with concurrent_blocks(resident=5):
        assert ss.resident_blocks(kernel, sig, 32, 64) == 5
    assert ss.resident_blocks(kernel, sig, 32, 64) == 1


# ----------------------------------------------------------------- planning (host)


@sim_only
def test_split_refused_where_a_row_blocks_cannot_be_held_at_once():
    # The plain simulator holds one block at a time.
    with pytest.raises(ValueError, match="at once"):
        plan(2, 64, np.float32, method="split", block_size=32, chunks=2)
    with concurrent_blocks(resident=3):
        with pytest.raises(ValueError, match="at once"):
            plan(2, 64, np.float32, method="split", block_size=32, chunks=4)
        assert plan(2, 64, np.float32, method="split", block_size=32, chunks=3)[0].chunks == 3
    with pytest.raises(ValueError, match="chunks"):
        plan(2, 8, np.float32, method="split", block_size=32, chunks=3)  # 2 packs of 4


@sim_only
def test_auto_takes_split_for_rows_wider_than_a_block_else_block_uncached():
    cols = 20000  # 80 KB of float32: more than the simulator's 48 KiB per block
    with concurrent_blocks(resident=64):
        how = plan(3, cols, np.float32, block_size=32)[0]
        assert how.method == "split" and how.chunks == ss.default_chunks(cols, 4, 4) == 5
        assert plan(3, 1000, np.float32, block_size=32)[0].method == "warp"
        assert plan(3, 2000, np.float32, block_size=32)[0].method == "block_smem"
    assert plan(3, cols, np.float32, block_size=32)[0].method == "block_uncached"


def test_default_chunks():
    assert ss.default_chunks(131072, 4, 4) == 32  # 512 KiB rows in 16 KiB pieces
    assert ss.default_chunks(131072, 8, 2) == 16  # 256 KiB float16 rows
    assert ss.default_chunks(20000, 4, 4) == 5  # 80000 bytes: 4 pieces would be 20000
    assert ss.default_chunks(4096, 4, 4) == 2  # at least two
    assert ss.default_chunks(3, 1, 4) == 2
    assert ss.default_chunks(4, 4, 4) == 1  # at most one per pack


# ------------------------------------------------------------------ correctness (sim)

SPLIT_CASES = [  # (rows, cols, dtype, log, chunks, resident)
    (1, 70, np.float32, False, 4, 4),  # 35 packs of 2: chunks of 9, 9, 9, 8
    (2, 70, np.float16, True, 3, 3),  # exactly a row's blocks held at once
    (2, 37, np.float32, True, 3, 64),  # packs of 1; every block at once
    (3, 40, np.float16, False, 2, 2),
    (2, 20, np.float32, False, 4, 6),  # 5 packs of 4: chunks of 2, 2, 1 and 0 packs;
    # 8 items for 6 blocks: two blocks take row 1's last chunks after row 0's
    (2, 33, np.float16, False, 1, 1),  # one chunk: no waiting
]


@sim_only
@pytest.mark.parametrize(
    "rows,cols,dtype,log,chunks,resident",
    SPLIT_CASES,
    ids=lambda v: getattr(v, "__name__", str(v)),
)
@pytest.mark.parametrize("stages", [1, 2])
def test_split_path(rows, cols, dtype, log, chunks, resident, stages):
    # Two stages: a block loads its next item into its second buffer before writing
    # the one before.
    x = random_rows(rows, cols, dtype, seed=stages)
    y, how, launcher = run_split(x, log, resident, stages=stages, chunks=chunks)
    assert (how.chunks, how.stages) == (chunks, stages)
    assert how.smem == stages * cdiv(cols // how.pack, chunks) * how.pack * x.itemsize
    check(y, x, log)
    assert not any(a.copy_to_host().any() for a in launcher.scratch())  # re-armed


def test_split_stages_are_one_or_two():
    with pytest.raises(ValueError, match="stages must be 1 or 2"):
        ss.split_kernel(np.dtype(np.float32), np.dtype(np.float32), 1, 1, 2, False, stages=3)


@sim_only
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_split_huge_and_infinite_values(dtype):
    # -inf entries, all -inf but one, 1e30 / 6e4, in two chunks: huge maxima in both
    # (row 0), one chunk's values far below the other's (row 1), a chunk all -inf
    # (row 3). (A row of only -inf gives NaN on a GPU; the simulator's math.log(0)
    # raises, as on the other paths.)
    x = special_rows(40, dtype)
    for log in (False, True):
        y, _, _ = run_split(x, log, chunks=2)
        check(y, x, log)


@sim_only
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_split_chunks_whose_max_is_zero(dtype):
    # A chunk's pair with max +0.0 (all of a chunk 0, or its max exactly 0, or -0.0)
    # is published as non-zero bits (its sum is >= 1): the readers see it arrive.
    x = -np.abs(random_rows(3, 48, dtype))
    x[0, :16] = 0
    x[1, 20] = 0
    x[2, :] = -0.0
    y, _, launcher = run_split(x, chunks=3)
    check(y, x, False)
    assert not any(a.copy_to_host().any() for a in launcher.scratch())


def _split_layout(x, packed: bool, chunks: int, block: int, pack: int):
    """The split kernel with the piece cached as raw packs or element by element."""
    rows, cols = x.shape
    dx, dy = cuda.to_device(x), cuda.device_array(x.shape, x.dtype)
    with concurrent_blocks(8) if SIM else contextlib.nullcontext():
        how, launcher = ss.plan_split(
            rows, cols, x.dtype, x.dtype, pack, False, block_size=block, chunks=chunks,
            packed=packed,
        )  # fmt: skip
        launcher[how.grid, how.block, 0, how.smem](dx, dy, rows, cols)
    return dy.copy_to_host()


@sim_only
@pytest.mark.parametrize("packed", [False, True], ids=["elements", "packs"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_split_both_piece_layouts(dtype, packed):
    # auto caches 2-byte inputs as raw packs, 4-byte ones element by element; both
    # layouts are exact for both (35 packs of 2 in 3 chunks: 12, 12, 11; one row: a
    # block's layout is the same whatever the rows).
    x = random_rows(1, 70, dtype)
    check(_split_layout(x, packed, chunks=3, block=32, pack=2), x, False)


@sim_only
def test_split_counters_rearm_for_the_next_launch():
    # 2 rows of 3 chunks for 5 blocks: a block takes a second item.
    x = random_rows(2, 48, np.float32)
    z = random_rows(2, 48, np.float32, seed=5)
    y, how, launcher = run_split(x, chunks=3, resident=5)
    check(y, x, False)
    counters, partials = launcher.scratch()
    assert not counters.copy_to_host().any() and not partials.copy_to_host().any()
    dz, dy = cuda.to_device(z), cuda.device_array(z.shape, z.dtype)
    with concurrent_blocks(resident=5):
        launcher[how.grid, how.block, 0, how.smem](dz, dy, 2, 48)
        with pytest.raises(ValueError, match="2 rows"):
            launcher[how.grid, how.block, 0, how.smem](dz[:1], dy[:1], 1, 48)
    check(dy.copy_to_host(), z, False)
    assert not counters.copy_to_host().any() and not partials.copy_to_host().any()


@sim_only
def test_split_through_softmax():
    x = random_rows(2, 36, np.float16)
    with concurrent_blocks(resident=8):
        y = softmax(x, method="split", block_size=32)
        out = np.zeros((2, 36), np.float32)
        softmax(cuda.to_device(x), method="split", block_size=32, out=out, log=True)
    check(y, x, False)
    np.testing.assert_allclose(out, reference(x, True), rtol=1e-5, atol=1e-5)


@sim_only
def test_split_scratch_is_per_stream():
    """Each stream gets its own zeroed scratch (two launches at once on two streams
    would otherwise share tickets and pairs); a launch on stream 5 uses and re-arms
    stream 5's only."""
    x = random_rows(3, 48, np.float32)
    dx, dy = cuda.to_device(x), cuda.device_array(x.shape, x.dtype)
    with concurrent_blocks(resident=5):
        how, launcher = plan(3, 48, np.float32, method="split", block_size=32, chunks=3)
        launcher.launch(dx, dy, 3, 48, how.grid, how.block, how.smem, 5)
    check(dy.copy_to_host(), x, False)
    assert list(launcher._scratch) == [5]  # stream 0's was never made
    five = launcher.scratch(5)
    assert launcher.scratch(5) is five and launcher.scratch(0) is not five
    counters, partials = five
    assert counters.shape == (4,) and partials.shape == (9,)
    assert counters.dtype == np.int32 and partials.dtype == np.int64
    for a in (*five, *launcher.scratch(0)):
        assert not a.copy_to_host().any()


def test_split_scratch_per_thread_on_the_per_thread_default_stream():
    """CU_STREAM_PER_THREAD (handle 2) is a different stream in every thread."""
    from kernels.common.devarray import PER_THREAD

    launcher = ss.SplitLauncher(kernel=None, rows=2, chunks=2)
    got: dict = {}

    def take(name: str) -> None:
        got[name] = (launcher.scratch(PER_THREAD), launcher.scratch(PER_THREAD))

    threads = [threading.Thread(target=take, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got["a"][0] is got["a"][1] and got["b"][0] is got["b"][1]
    assert got["a"][0] is not got["b"][0]


@sim_only  # made-up stream handles: a GPU's driver would take them for pointers
def test_split_scratch_from_threads_at_once_and_bounded(monkeypatch):
    monkeypatch.setattr(ss, "SCRATCH_KEEP", 4)
    launcher = ss.SplitLauncher(kernel=None, rows=2, chunks=3)
    start = threading.Barrier(8)
    got: list = [None] * 8

    def take(i: int) -> None:
        start.wait()
        got[i] = launcher.scratch(7)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g is got[0] for g in got)  # one scratch for the stream, made once
    for stream in range(10, 16):
        launcher.scratch(stream)
    assert list(launcher._scratch) == [12, 13, 14, 15]  # the oldest streams' dropped


# ------------------------------------------------------------------- full size (GPU)


def _gpu_rows(cols: int) -> list[int]:
    return sorted({1, 2, 3, 37, max(4, min(20000, (1 << 24) // cols))})


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [4097, 65536, 131072, 131073, 2**20])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_split_shapes(cols, dtype):
    for rows in _gpu_rows(cols):
        x = random_rows(rows, cols, dtype)
        for log in (False, True):
            y, how, _ = run_split(x, log)
            check(y, x, log)
    assert how.chunks == ss.default_chunks(cols, how.pack, np.dtype(dtype).itemsize)
    assert how.stages == ss.SPLIT_STAGES


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [131072, 12345])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_split_special_values(cols, dtype):
    x = special_rows(cols, dtype)
    x = np.concatenate([x, np.full((1, cols), -np.inf, dtype)])
    for log in (False, True):
        y, _, _ = run_split(x, log)
        check(y, x, log)


@pytest.mark.gpu
def test_gpu_split_variants_and_repeated_launches():
    """Chunks, block sizes and unrolls the benchmark sweeps; 50 launches in a row on
    one launcher, alternating two inputs (the scratch re-arms itself: a pair left
    from the launch before would spoil the last one), 512 rows of 131072 (2^26)."""
    rows, cols = 512, 131072
    x = random_rows(rows, cols, np.float32)
    z = random_rows(rows, cols, np.float32, seed=3) * np.float32(2)
    dx, dz = cuda.to_device(x), cuda.to_device(z)
    dy = cuda.device_array(x.shape, x.dtype)
    ref_rows = [0, 1, 255, 511]
    for kw in (
        dict(chunks=4),  # two 128 KiB buffers do not fit a block: one stage
        dict(chunks=8, block_size=1024),
        dict(chunks=32, block_size=128, unroll=1),
        dict(chunks=64, unroll=2),
        dict(chunks=8, block_size=256, unroll=2),
    ):
        how, launcher = plan(rows, cols, np.float32, method="split", **kw)
        assert how.stages == (1 if kw == dict(chunks=4) else 2), kw
        launch = launcher[how.grid, how.block, 0, how.smem]
        for i in range(50):
            launch(dz if i % 2 else dx, dy, rows, cols)
        y = dy.copy_to_host()
        check(y[ref_rows], z[ref_rows], False)
        assert not any(a.copy_to_host().any() for a in launcher.scratch()), kw


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [4097, 131072, 131073, 2**20])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_split_one_stage_shapes(cols, dtype):
    for rows in _gpu_rows(cols):
        x = random_rows(rows, cols, dtype, seed=1)
        for log in (False, True):
            y, how, _ = run_split(x, log, stages=1)
            check(y, x, log)
    assert how.stages == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_split_two_stages_geometries_repeated(dtype):
    """Two-stage geometries the sweep measures, 20 launches each on one launcher
    alternating two inputs (512 rows of 131072, 2^26 elements); scratch re-armed."""
    rows, cols = 512, 131072
    pack = 16 // np.dtype(dtype).itemsize
    x = random_rows(rows, cols, dtype)
    z = random_rows(rows, cols, dtype, seed=3)
    dx, dz = cuda.to_device(x), cuda.to_device(z)
    dy = cuda.device_array(x.shape, x.dtype)
    for chunks, block, unroll, per_sm in ((8, 512, 2, 3), (16, 256, 2, 6), (12, 256, 4, 0)):
        how, launcher = ss.plan_split(
            rows, cols, dtype, dtype, pack, False, block_size=block, chunks=chunks,
            unroll=unroll, bounds=(block, per_sm) if per_sm else None, stages=2,
        )  # fmt: skip
        launch = launcher[how.grid, how.block, 0, how.smem]
        for i in range(20):
            launch(dz if i % 2 else dx, dy, rows, cols)
        check(dy.copy_to_host(), z, False)
        assert not any(a.copy_to_host().any() for a in launcher.scratch()), chunks


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["elements", "packs"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_split_both_piece_layouts(dtype, packed):
    x = random_rows(64, 131072, dtype)
    pack = 16 // np.dtype(dtype).itemsize
    check(_split_layout(x, packed, chunks=4, block=256, pack=pack), x, False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_split_default_geometry_repeated(dtype):
    """auto's geometry (pieces of SPLIT_CHUNK_BYTES, SPLIT_BLOCK threads, launch
    bounds, two buffers a block), 30 launches on one launcher alternating two inputs,
    2^26 elements; scratch re-armed."""
    rows, cols = 512, 131072
    x = random_rows(rows, cols, dtype)
    how, launcher = plan(rows, cols, dtype)
    itemsize = np.dtype(dtype).itemsize
    assert (how.method, how.chunks, how.block[0], how.unroll, how.stages) == (
        "split", ss.default_chunks(cols, 16 // itemsize, itemsize), ss.SPLIT_BLOCK,
        ss.SPLIT_UNROLL, ss.SPLIT_STAGES,
    )  # fmt: skip
    z = random_rows(rows, cols, dtype, seed=3)
    dx, dz = cuda.to_device(x), cuda.to_device(z)
    dy = cuda.device_array(x.shape, x.dtype)
    launch = launcher[how.grid, how.block, 0, how.smem]
    for i in range(30):
        launch(dz if i % 2 else dx, dy, rows, cols)
    check(dy.copy_to_host(), z, False)
    assert not any(a.copy_to_host().any() for a in launcher.scratch())


@pytest.mark.gpu
def test_gpu_auto_takes_split_for_wide_rows():
    for dtype in (np.float32, np.float16):
        how = plan(512, 131072, dtype)[0]
        assert how.method == "split" and how.chunks >= 2
    assert plan(100, 2**20, np.float32)[0].method == "split"
    assert plan(1000, 32768, np.float32)[0].method == "block_smem"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_split_on_two_streams_at_once(dtype):
    """One plan (one launcher) on two non-blocking streams, 20 launches each,
    interleaved so that launches of the two streams overlap on the GPU: each stream
    has its own scratch, so neither corrupts the other's tickets and pairs."""
    from test_softmax import _destroy_stream, _new_stream

    from kernels.common.cudadrv import driver

    rows, cols = 64, 131072
    x1 = random_rows(rows, cols, dtype, seed=1)
    x2 = random_rows(rows, cols, dtype, seed=2) * dtype(2)
    softmax(x1)  # plan and compile
    a, b = _new_stream(), _new_stream()
    try:
        d1, d2 = arrays.to_device(x1, a), arrays.to_device(x2, b)
        y1, y2 = arrays.empty(x1.shape, dtype, a), arrays.empty(x2.shape, dtype, b)
        for _ in range(20):
            softmax(d1, out=y1, stream=a)
            softmax(d2, out=y2, stream=b)
        driver().synchronize(a)
        driver().synchronize(b)
        check(y1.copy_to_host(), x1, False)
        check(y2.copy_to_host(), x2, False)
        launcher = next(e[-1] for k, e in sm._PLANS.items() if k[:2] == (rows, cols) and e[-1])
        for stream in (a, b):
            assert not any(s.copy_to_host().any() for s in launcher.scratch(stream))
    finally:
        _destroy_stream(a)
        _destroy_stream(b)
