"""kernels.softmax's `block_spill` path (kernels.softmax_spill) against float64 NumPy.

On the simulator the cache is made small (`cache_packs`), so that rows of a few
dozen columns already spill; tests marked `gpu` run full-size rows with the
device's whole cache.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from test_softmax import check, random_rows, special_rows

from kernels import softmax_spill as sp
from kernels.softmax import plan, softmax


def run_spill(x, log=False, **kw):
    """The block_spill kernel on x; returns (y, plan)."""
    rows, cols = x.shape
    dx, dy = cuda.to_device(x), cuda.device_array(x.shape, x.dtype)
    how, kernel = plan(rows, cols, x.dtype, log=log, method="block_spill", **kw)
    assert how.method == "block_spill" and 1 <= how.grid <= rows
    kernel[how.grid, how.block, 0, how.smem](dx, dy, rows, cols)
    return dy.copy_to_host(), how


# (rows, cols, dtype, cache_packs, block_size): caches smaller than, equal to and larger
# than the row, packs of 1, 2, 4 and 8, rows strided over a smaller grid.
CASES = [
    (3, 40, np.float32, 3, 32),  # packs of 4: 10, 3 cached
    (2, 33, np.float16, 5, 32),  # packs of 1 (odd width): 28 past the cache
    (5, 64, np.float16, 2, 32),  # packs of 8: 8, 2 cached
    (1, 1000, np.float32, 100, 64),  # packs of 4: 250, unroll reaches past the row
    (4, 31, np.float32, 31, 32),  # the whole row cached
    (2, 6, np.float16, 50, 32),  # a cache larger than the row: block_smem's work
    (3, 1, np.float32, 1, 32),  # one column
]


@pytest.mark.parametrize(
    "rows,cols,dtype,cache_packs,block", CASES, ids=lambda v: getattr(v, "__name__", str(v))
)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log"])
def test_spill_path(rows, cols, dtype, cache_packs, block, log):
    x = random_rows(rows, cols, dtype)
    y, how = run_spill(x, log, cache_packs=cache_packs, block_size=block)
    assert how.smem == min(cache_packs, cols // how.pack) * how.pack * np.dtype(dtype).itemsize
    check(y, x, log)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_spill_huge_and_infinite_values(dtype):
    # -inf entries (in and past the cache), all -inf but one, 1e30 / 6e4, maxima past
    # the cache only. (A row of only -inf gives NaN on a GPU; the simulator's
    # math.log(0) raises, as on the other paths.)
    x = special_rows(40, dtype)
    x[3, :20] = -np.inf
    x[3, 30] = 1e30 if dtype == np.float32 else 6e4
    for log in (False, True):
        y, _ = run_spill(x, log, cache_packs=2, block_size=32)
        check(y, x, log)


def test_spill_through_softmax_and_mixed_dtypes():
    x = random_rows(3, 100, np.float16)
    out = np.empty(x.shape, np.float32)
    softmax(x, method="block_spill", out=out)
    check(out, x, False)
    y = softmax(cuda.to_device(x.astype(np.float32)), log=True, method="block_spill")
    check(y.copy_to_host(), x.astype(np.float32), True)


def test_spill_refused_where_the_cache_cannot_be_given():
    # The simulator grants no shared memory past 48 KiB (there is no opt-in there);
    # a GPU grants its opt-in limit and no more.
    packs = 10**6
    with pytest.raises(ValueError, match="block_spill.*shared memory"):
        plan(1, 4 * packs, np.float32, method="block_spill", cache_packs=packs)


# ------------------------------------------------------------------- full size (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("cols", [131072, 131073, 65536 + 8, 2**20])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_spill_shapes(cols, dtype):
    for rows in sorted({1, 2, 3, 37, max(4, min(1000, (1 << 24) // cols))}):
        x = random_rows(rows, cols, dtype)
        for log in (False, True):
            y, how = run_spill(x, log)
            check(y, x, log)
    row_bytes = how.pack * (cols // how.pack) * np.dtype(dtype).itemsize
    cache = sp.default_cache_packs(how.pack, np.dtype(dtype).itemsize) * how.pack
    assert how.smem == min(row_bytes, cache * np.dtype(dtype).itemsize)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_gpu_spill_special_values(dtype):
    cols = 131072
    x = special_rows(cols, dtype)
    x[3, : cols // 2] = -np.inf  # the row's max past the cache
    x[3, -5] = 1e30 if dtype == np.float32 else 6e4
    x = np.concatenate([x, np.full((1, cols), -np.inf, dtype)])
    x[-1, 7] = 1.0
    for log in (False, True):
        y, _ = run_spill(x, log)
        check(y, x, log)


@pytest.mark.gpu
def test_gpu_spill_many_rows_repeated():
    """512 rows of 131072 float16 (2^26 elements), rows strided over the grid, ten
    launches in a row on the same output."""
    rows, cols = 512, 131072
    x = random_rows(rows, cols, np.float16)
    dx, dy = cuda.to_device(x), cuda.device_array(x.shape, x.dtype)
    how, kernel = plan(rows, cols, np.float16, method="block_spill")
    assert how.grid < rows
    launch = kernel[how.grid, how.block, 0, how.smem]
    for _ in range(10):
        launch(dx, dy, rows, cols)
    picked = [0, 1, how.grid - 1, how.grid, rows - 1]
    check(dy.copy_to_host()[picked], x[picked], False)
