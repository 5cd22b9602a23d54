"""Softmax and log-softmax over the last axis of a (rows, cols) array, in Numba CUDA.

The design is OneFlow's softmax.cuh (three kernels and a dispatch on the row width):

- `warp`: a group of 1..32 lanes (a power of two, aligned inside a warp) per row, for
  cols <= 1024. The row lives in registers; packs of 1, 2 or 4 elements are loaded as
  one 32- or 64-bit word; max and sum are butterfly-shuffle all-reduces inside the
  group. Narrow rows (cols <= 32 * pack) give each lane one pack and, when rows is
  even, two rows per access. Lanes past the row's end hold -inf (padding).
- `block_smem`: a block per row; the row is cached in dynamic shared memory (float32,
  pack element i of pack p at i * packs + p so a warp's stores hit 32 banks), block
  size the largest of 128..1024 that keeps the most blocks resident (occupancy API).
  Above 48 KiB of shared memory the kernel opts in, up to the device's limit.
- `block_uncached`: a block (1024 threads) per row that reads the row twice from
  global memory: one pass for the max and an online (rescaled) sum, one for the
  output. OneFlow reads it three times (max, sum, output).
- `auto`: warp for cols <= 1024, else block_smem when it can launch, else
  block_uncached.

Inputs and outputs are float32 or float16 (they may differ), computation is float32,
numerically safe (the row max is subtracted). Grids follow OneFlow's GetNumBlocks
(at most 32 waves of resident blocks) and kernels stride over rows.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, from_dtype, types, uint32

from .arrays import as_device_array, is_device_array
from .launch import (
    SMEM_LIMIT,
    active_blocks_per_sm,
    allow_dynamic_smem,
    cdiv,
    largest_block_keeping_occupancy,
    wave_blocks,
)
from .reduce import (
    block_allreduce_max,
    block_allreduce_sum,
    group_mask,
    warp_allreduce_max,
    warp_allreduce_sum,
)

METHODS = ("auto", "warp", "block_smem", "block_uncached")
DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
WARP_MAX_COLS = 1024
WARP_BLOCK = 128  # threads per block of the warp kernel (OneFlow's choice)
UNCACHED_BLOCK = 1024
BLOCK_SIZES = (128, 256, 512, 1024)
MAX_PACK_BYTES = 8  # Numba loads at most a 64-bit scalar in one instruction
NEG_INF = float32(-math.inf)
_WORD = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class Plan:
    """How one call runs: the path and its launch geometry."""

    method: str
    pack: int
    grid: int
    block: tuple[int, int]
    smem: int = 0  # dynamic shared memory bytes per block
    width: int = 0  # warp path: lanes per row
    cols_per_thread: int = 0  # warp path
    rows_per_access: int = 1  # warp path


# ------------------------------------------------------------------------------ kernels


def _word(dtype: np.dtype, pack: int):
    """The unsigned word type one pack of `dtype` is loaded as (the dtype itself for 1)."""
    return dtype.type if pack == 1 else _WORD[dtype.itemsize * pack]


@functools.cache
def warp_kernel(in_dtype, out_dtype, pack, cols_per_thread, width, rows_per_access, padding, log):
    """The warp kernel specialised on its compile-time shape (OneFlow's template args).

    Launch with block (width, WARP_BLOCK // width); xv and yv are the (rows, cols)
    input and output viewed as (rows, cols // pack) packed words.
    """
    in_t, out_t = from_dtype(in_dtype), from_dtype(out_dtype)
    in_word, out_word = _word(in_dtype, pack), _word(out_dtype, pack)
    num_packs = cols_per_thread // pack

    @cuda.jit
    def softmax_warp(xv, yv, rows, cols):
        buf = cuda.local.array((rows_per_access, cols_per_thread), float32)
        row_max = cuda.local.array(rows_per_access, float32)
        row_sum = cuda.local.array(rows_per_access, float32)
        tin = cuda.local.array(pack, in_t)
        tout = cuda.local.array(pack, out_t)
        tin_word = tin.view(in_word)
        tout_word = tout.view(out_word)
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
                        tin_word[0] = xv[uint32(row + r), uint32(pc)]
                        for i in range(pack):
                            v = float32(tin[i])
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
                        s += math.exp(v)
                    else:
                        v = math.exp(buf[r, j] - row_max[r])
                        buf[r, j] = v
                        s += v
                row_sum[r] = warp_allreduce_sum(s, width, mask)
            for r in range(rows_per_access):
                lse = math.log(row_sum[r])
                for p in range(num_packs):
                    pc = p * width + lane
                    if not padding or pc < packs:
                        for i in range(pack):
                            v = buf[r, p * pack + i]
                            tout[i] = v - lse if log else v / row_sum[r]
                        yv[uint32(row + r), uint32(pc)] = tout_word[0]
            row += step

    return softmax_warp


@functools.cache
def block_smem_kernel(in_dtype, out_dtype, pack, log):
    """The block-per-row kernel with the row cached in shared memory (cols * 4 bytes)."""
    in_t, out_t = from_dtype(in_dtype), from_dtype(out_dtype)
    in_word, out_word = _word(in_dtype, pack), _word(out_dtype, pack)

    @cuda.jit
    def softmax_block_smem(xv, yv, rows, cols):
        buf = cuda.shared.array(0, float32)
        tin = cuda.local.array(pack, in_t)
        tout = cuda.local.array(pack, out_t)
        tin_word = tin.view(in_word)
        tout_word = tout.view(out_word)
        # Strided loops are `while` loops over uint32 counters: Numba's range() with a
        # runtime step costs a dozen 64-bit instructions per iteration.
        tid = uint32(cuda.threadIdx.x)
        nthreads = uint32(cuda.blockDim.x)
        packs = uint32(cols // pack)
        ucols = uint32(cols)
        row = cuda.blockIdx.x
        while row < rows:
            urow = uint32(row)
            m = NEG_INF
            p = tid
            while p < packs:
                tin_word[0] = xv[urow, p]
                for i in range(pack):
                    v = float32(tin[i])
                    buf[uint32(i * packs + p)] = v
                    m = max(m, v)
                p = uint32(p + nthreads)
            rmax = block_allreduce_max(m)
            s = float32(0.0)
            c = tid
            while c < ucols:
                if log:
                    v = buf[c] - rmax
                    buf[c] = v
                    s += math.exp(v)
                else:
                    v = math.exp(buf[c] - rmax)
                    buf[c] = v
                    s += v
                c = uint32(c + nthreads)
            rsum = block_allreduce_sum(s)
            lse = math.log(rsum)
            inv = float32(1.0) / rsum
            # Each thread reads back only the slots it wrote in the first loop, so the
            # next row's first loop needs no barrier before overwriting them.
            p = tid
            while p < packs:
                for i in range(pack):
                    v = buf[uint32(i * packs + p)]
                    tout[i] = v - lse if log else v * inv
                yv[urow, p] = tout_word[0]
                p = uint32(p + nthreads)
            row += cuda.gridDim.x

    return softmax_block_smem


@functools.cache
def block_uncached_kernel(in_dtype, out_dtype, pack, log):
    """The block-per-row kernel that reads the row from global memory twice."""
    in_t, out_t = from_dtype(in_dtype), from_dtype(out_dtype)
    in_word, out_word = _word(in_dtype, pack), _word(out_dtype, pack)

    @cuda.jit
    def softmax_block_uncached(xv, yv, rows, cols):
        tin = cuda.local.array(pack, in_t)
        tout = cuda.local.array(pack, out_t)
        tin_word = tin.view(in_word)
        tout_word = tout.view(out_word)
        tid = uint32(cuda.threadIdx.x)
        nthreads = uint32(cuda.blockDim.x)
        packs = uint32(cols // pack)
        row = cuda.blockIdx.x
        while row < rows:
            urow = uint32(row)
            # Online normaliser: d is this thread's sum of exp(x - m) for its running
            # max m, rescaled whenever m grows, so one pass gives both.
            m = NEG_INF
            d = float32(0.0)
            p = tid
            while p < packs:
                tin_word[0] = xv[urow, p]
                for i in range(pack):
                    v = float32(tin[i])
                    if v > m:
                        d = d * math.exp(m - v) + float32(1.0)
                        m = v
                    elif m > NEG_INF:
                        d += math.exp(v - m)
                p = uint32(p + nthreads)
            rmax = block_allreduce_max(m)
            s = d * math.exp(m - rmax) if m > NEG_INF else float32(0.0)
            rsum = block_allreduce_sum(s)
            lse = math.log(rsum)
            inv = float32(1.0) / rsum
            p = tid
            while p < packs:
                tin_word[0] = xv[urow, p]
                for i in range(pack):
                    v = float32(tin[i]) - rmax
                    tout[i] = v - lse if log else math.exp(v) * inv
                yv[urow, p] = tout_word[0]
                p = uint32(p + nthreads)
            row += cuda.gridDim.x

    return softmax_block_uncached


# ----------------------------------------------------------------------------- planning


def _pack_size(cols: int, dtypes, addresses=()) -> int:
    """Largest pack of 4, 2, 1 elements dividing cols, fitting a 64-bit word, aligned."""
    widest = max(np.dtype(d).itemsize for d in dtypes)
    for pack in (4, 2):
        if cols % pack or pack * widest > MAX_PACK_BYTES:
            continue
        if all(
            a % (pack * np.dtype(d).itemsize) == 0 for a, d in zip(addresses, dtypes, strict=False)
        ):
            return pack
    return 1


def warp_geometry(rows: int, cols: int, pack: int) -> tuple[int, int, int]:
    """(width, cols_per_thread, rows_per_access) of the warp path, as OneFlow picks them."""
    if cols <= 32 * pack:
        width = 1
        while width * pack < cols:
            width *= 2
        return width, pack, 2 if rows % 2 == 0 else 1
    return 32, cdiv(cols, 32 * pack) * pack, 1


def _signature(in_dtype, out_dtype, pack):
    arr = types.Array
    return (
        arr(from_dtype(np.dtype(_word(in_dtype, pack))), 2, "C"),
        arr(from_dtype(np.dtype(_word(out_dtype, pack))), 2, "C"),
        types.int64,
        types.int64,
    )


def _check_block_size(block_size: int) -> None:
    if block_size % 32 or not 32 <= block_size <= 1024:
        raise ValueError(f"block_size must be a multiple of 32 in 32..1024, got {block_size}")


def plan(
    rows: int,
    cols: int,
    in_dtype,
    out_dtype=None,
    *,
    log: bool = False,
    method: str = "auto",
    block_size: int | None = None,
    addresses: tuple[int, ...] = (),
) -> tuple[Plan, object]:
    """Choose the path and launch geometry; returns (plan, kernel).

    `block_size` forces the block paths' block size (tests, tuning); `addresses` are
    the input and output device pointers, whose alignment limits the pack size.
    Raises ValueError when the requested method cannot run this width.
    """
    in_dtype = np.dtype(in_dtype)
    out_dtype = in_dtype if out_dtype is None else np.dtype(out_dtype)
    if method not in METHODS:
        raise ValueError(f"unknown softmax method {method!r}; choose one of {', '.join(METHODS)}")
    if block_size is not None:
        _check_block_size(block_size)
    pack = _pack_size(cols, (in_dtype, out_dtype), addresses)
    log = bool(log)

    if method == "warp" or (method == "auto" and cols <= WARP_MAX_COLS):
        if cols > WARP_MAX_COLS:
            raise ValueError(f"method 'warp' handles cols <= {WARP_MAX_COLS}, got {cols}")
        width, cpt, rpa = warp_geometry(rows, cols, pack)
        groups = WARP_BLOCK // width
        grid = wave_blocks(WARP_BLOCK, cdiv(cdiv(rows, rpa), groups))
        padding = cols != cpt * width
        kernel = warp_kernel(in_dtype, out_dtype, pack, cpt, width, rpa, padding, log)
        return Plan("warp", pack, grid, (width, groups), 0, width, cpt, rpa), kernel

    if method in ("block_smem", "auto"):
        smem = cols * 4
        kernel = block_smem_kernel(in_dtype, out_dtype, pack, log)
        size = block_size
        if size is None or smem > SMEM_LIMIT:
            compiled = kernel.compile(_signature(in_dtype, out_dtype, pack))
            if not allow_dynamic_smem(compiled, smem):
                size = 0
            elif size is None:
                size = largest_block_keeping_occupancy(
                    lambda bs: active_blocks_per_sm(compiled, bs, smem), BLOCK_SIZES
                )
        if size:
            return Plan("block_smem", pack, wave_blocks(size, rows), (size, 1), smem), kernel
        if method == "block_smem":
            raise ValueError(
                f"method 'block_smem' cannot launch: a row of {cols} columns needs {smem} "
                "bytes of shared memory, more than this device gives a block"
            )

    size = block_size or UNCACHED_BLOCK
    kernel = block_uncached_kernel(in_dtype, out_dtype, pack, log)
    return Plan("block_uncached", pack, wave_blocks(size, rows), (size, 1)), kernel


# ------------------------------------------------------------------------------ the API


def _describe(obj) -> str:
    return type(obj).__name__


def _validate(arr, name: str) -> None:
    shape = getattr(arr, "shape", None)
    dtype = getattr(arr, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(f"{name} must be an array, got {_describe(arr)}")
    if len(shape) != 2:
        raise ValueError(f"{name} must be 2-D (rows, cols), got shape {tuple(shape)}")
    if np.dtype(dtype) not in DTYPES:
        raise TypeError(f"{name} must be float32 or float16, got {np.dtype(dtype)}")


def _pointers(*arrays) -> tuple[int, ...]:
    """Device addresses of the arrays, or () where an array does not expose one."""
    try:
        return tuple(int(a.__cuda_array_interface__["data"][0]) for a in arrays)
    except AttributeError:
        return ()


def softmax(
    x,
    *,
    log: bool = False,
    method: str = "auto",
    out=None,
    block_size: int | None = None,
):
    """Softmax (or log-softmax with log=True) of each row of a 2-D float array.

    x: (rows, cols) float32 or float16, a NumPy array or a device array (anything with
    __cuda_array_interface__). Returns an array of x's shape and dtype, on the host for
    a host input and on the device (a Numba device array) for a device input; with
    `out` (host or device, same shape, float32 or float16) the result is written there
    and `out` is returned. method: "auto", "warp", "block_smem" or "block_uncached"
    (see the module docstring). block_size forces the block paths' threads per block.
    """
    if method not in METHODS:
        raise ValueError(f"unknown softmax method {method!r}; choose one of {', '.join(METHODS)}")
    on_device = is_device_array(x)
    if on_device:
        dx = as_device_array(x)
        _validate(dx, "x")
        if not dx.is_c_contiguous():
            raise ValueError("x must be C-contiguous (rows of consecutive elements)")
    else:
        if not isinstance(x, np.ndarray):
            raise TypeError(f"x must be a NumPy or device array, got {_describe(x)}")
        _validate(x, "x")
        dx = None
    rows, cols = (int(n) for n in x.shape)
    dout = None
    if out is not None:
        if is_device_array(out):
            dout = as_device_array(out)
            _validate(dout, "out")
            if not dout.is_c_contiguous():
                raise ValueError("out must be C-contiguous")
        elif isinstance(out, np.ndarray):
            _validate(out, "out")
        else:
            raise TypeError(f"out must be a NumPy or device array, got {_describe(out)}")
        if tuple(out.shape) != (rows, cols):
            raise ValueError(f"out has shape {tuple(out.shape)}, x has {(rows, cols)}")
    if dx is None:
        dx = cuda.to_device(np.ascontiguousarray(x))
    out_dtype = np.dtype((dx if out is None else dout if dout is not None else out).dtype)
    dy = dout if dout is not None else cuda.device_array((rows, cols), dtype=out_dtype)

    if rows and cols:
        how, kernel = plan(
            rows,
            cols,
            dx.dtype,
            dy.dtype,
            log=log,
            method=method,
            block_size=block_size,
            addresses=_pointers(dx, dy),
        )
        xv = dx.view(_word(np.dtype(dx.dtype), how.pack))
        yv = dy.view(_word(np.dtype(dy.dtype), how.pack))
        kernel[how.grid, how.block, 0, how.smem](xv, yv, rows, cols)

    if out is None:
        return dy if on_device else dy.copy_to_host()
    if dout is None:
        out[...] = dy.copy_to_host()
    return out


def log_softmax(x, *, method: str = "auto", out=None, block_size: int | None = None):
    """softmax(x, log=True, ...): log of the softmax of each row, computed stably."""
    return softmax(x, log=True, method=method, out=out, block_size=block_size)
