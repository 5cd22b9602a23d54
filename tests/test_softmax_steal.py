"""kernels.softmax_steal (the split path with slabs taken from a per-row counter)
against float64 NumPy: on the simulator under test_softmax_split's concurrent_blocks
shim (small rows cut into many slabs: packs of 1 or 2, 32-thread warps), full size on
a GPU (tests marked gpu)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from numba import cuda
from test_softmax import check, random_rows, special_rows
from test_softmax_split import SIM, concurrent_blocks, sim_only

from kernels import softmax_steal as st


def run_steal(x, log=False, *, pack=None, resident=64, **kw):
    """plan_steal's launch on x (host in, host out), and its plan and launcher."""
    rows, cols = x.shape
    if pack is None:
        pack = 16 // x.dtype.itemsize
        while cols % pack:
            pack //= 2
    dx, dy = cuda.to_device(x), cuda.device_array(x.shape, x.dtype)
    with concurrent_blocks(resident) if SIM else contextlib.nullcontext():
        how, launcher = st.plan_steal(rows, cols, x.dtype, x.dtype, pack, log, **kw)
        launcher[how.grid, how.block, 0, how.smem](dx, dy, rows, cols)
    return dy.copy_to_host(), how, launcher


def test_slots_cover_a_row_with_slack():
    # 131072 float16 in packs of 8: 16384 packs, slabs of 128 -> 128 slabs over
    # 4 blocks: 32 each, 36 with 4 slabs of slack.
    assert st.slab_packs(4) == 128
    assert st.slots_per_block(16384, 4, 4, 4) == 36
    assert st.slots_per_block(16384, 4, 4, 0) == 32
    assert st.slots_per_block(10, 1, 3, 1) == 2  # one partial slab: 1 + slack
    for packs, unroll, chunks in [(1000, 1, 3), (77, 2, 5), (16384, 4, 7)]:
        slots = st.slots_per_block(packs, unroll, chunks, 0)
        assert chunks * slots * st.slab_packs(unroll) >= packs


STEAL_CASES = [  # (rows, cols, dtype, log, pack, chunks, block, unroll, slack, resident)
    (3, 300, np.float32, False, 1, 3, 32, 1, 1, 4),  # 10 slabs, 3 blocks of 5 slots
    (2, 290, np.float16, True, 2, 2, 64, 1, 1, 3),  # two warps share 4 slots; partial slab
    (2, 2000, np.float32, False, 1, 3, 96, 1, 2, 4),  # 63 slabs, 3 warps, 23 slots a block
    (4, 200, np.float16, False, 2, 3, 32, 2, 2, 12),  # slabs of 64 packs, 2 slots slack
    (1, 1, np.float32, False, 1, 2, 32, 1, 1, 2),  # one element: one block gets nothing
    (5, 33, np.float32, True, 1, 4, 32, 1, 0, 5),  # 2 slabs for 4 blocks, no slack
    (2, 1000, np.float32, False, 4, 2, 64, 1, 0, 2),  # no slack: every slot is needed
]


@sim_only
@pytest.mark.parametrize(
    "rows,cols,dtype,log,pack,chunks,block,unroll,slack,resident",
    STEAL_CASES,
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_steal_path(rows, cols, dtype, log, pack, chunks, block, unroll, slack, resident):
    x = random_rows(rows, cols, dtype)
    y, how, launcher = run_steal(
        x, log, pack=pack, resident=resident, chunks=chunks, block_size=block,
        unroll=unroll, slack=slack,
    )  # fmt: skip
    assert how.method == "split" and how.chunks == chunks
    check(y, x, log)
    assert not launcher.scratch()[0].copy_to_host().any()  # counters re-armed


@sim_only
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("packed", [False, True], ids=["elements", "packs"])
def test_steal_huge_and_infinite_values_both_layouts(dtype, packed):
    x = special_rows(70, dtype)
    for log in (False, True):
        y, _, _ = run_steal(x, log, pack=2, chunks=3, block_size=32, unroll=1, packed=packed)
        check(y, x, log)


@sim_only
def test_steal_relaunch_on_one_launcher():
    x = random_rows(3, 256, np.float32)
    z = random_rows(3, 256, np.float32, seed=5)
    y, how, launcher = run_steal(x, pack=1, chunks=3, block_size=32, unroll=1, resident=5)
    check(y, x, False)
    dz, dy = cuda.to_device(z), cuda.device_array(z.shape, z.dtype)
    with concurrent_blocks(resident=5):
        launcher[how.grid, how.block, 0, how.smem](dz, dy, 3, 256)
    check(dy.copy_to_host(), z, False)
    assert not launcher.scratch()[0].copy_to_host().any()


@sim_only
def test_steal_refused_where_a_row_blocks_cannot_be_held_at_once():
    with concurrent_blocks(resident=3):
        with pytest.raises(ValueError, match="at once"):
            st.plan_steal(2, 64, np.float32, np.float32, 1, False, block_size=32, chunks=4)
    with pytest.raises(ValueError, match="multiple of 32"):
        st.plan_steal(2, 64, np.float32, np.float32, 1, False, block_size=48, chunks=2)


# ------------------------------------------------------------------- full size (GPU)

GPU_GEOMETRIES = [  # plan_steal's options; {}: the defaults
    dict(),
    dict(chunks=4, block_size=128, unroll=4, slack=4),
    dict(chunks=5, block_size=256, unroll=1),
    dict(chunks=8, block_size=512, unroll=2, slack=0),
]


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [4097, 65536, 131072, 131073, 2**20])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_steal_shapes(cols, dtype):
    for rows in sorted({1, 2, 3, 37, max(4, min(20000, (1 << 24) // cols))}):
        x = random_rows(rows, cols, dtype)
        for log in (False, True):
            y, _, _ = run_steal(x, log)
            check(y, x, log)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [131072, 12345])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_steal_special_values(cols, dtype):
    x = special_rows(cols, dtype)
    x = np.concatenate([x, np.full((1, cols), -np.inf, dtype)])
    for log in (False, True):
        y, _, _ = run_steal(x, log)
        check(y, x, log)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_steal_geometries_and_repeated_launches(dtype):
    """The sweep's geometries, 30 launches in a row on one launcher (the counters
    re-arm themselves), 2^26 elements of 131072 columns."""
    rows, cols = 512, 131072
    x = random_rows(rows, cols, dtype)
    dx, dy = cuda.to_device(x), cuda.device_array(x.shape, x.dtype)
    pack = 16 // np.dtype(dtype).itemsize
    ref_rows = [0, 1, 255, 511]
    for kw in GPU_GEOMETRIES:
        how, launcher = st.plan_steal(rows, cols, dtype, dtype, pack, False, **kw)
        launch = launcher[how.grid, how.block, 0, how.smem]
        for _ in range(30):
            launch(dx, dy, rows, cols)
        check(dy.copy_to_host()[ref_rows], x[ref_rows], False)
        assert not launcher.scratch()[0].copy_to_host().any()
