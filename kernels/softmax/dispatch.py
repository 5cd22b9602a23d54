"""Softmax and log-softmax over the last axis of a (rows, cols) array, in Numba CUDA:
the plan of a call and the entry points, `softmax` and `log_softmax`.

The design is OneFlow's softmax.cuh (three kernels, `kernels.softmax.kernels`, and a
dispatch on the row width):

- `warp`: a group of 1..32 lanes (a power of two, aligned inside a warp) per row, for
  cols <= 1024. The row lives in registers; max and sum are butterfly-shuffle
  all-reduces inside the group. Narrow rows (cols <= 32 * pack) give each lane one
  pack and, when rows is even, two rows per access. Lanes past the row's end hold
  -inf (padding).
- `block_smem`: a block per row; the row is cached in dynamic shared memory (pack
  element i of pack p at i * packs + p so a warp's accesses hit 32 banks), block size
  the largest of 128..1024 that keeps the most blocks resident (occupancy API). Above
  48 KiB of shared memory the kernel opts in, up to the device's limit. OneFlow's three
  passes (float32 cache: max; exp and sum in place; scale and write), or `online`
  (input-dtype cache: max and an online sum in one pass; exp again while writing).
- `block_uncached`: a block (1024 threads) per row that reads the row twice from
  global memory: one pass for the max and an online (rescaled) sum, one for the
  output. OneFlow reads it three times (max, sum, output).
- `split` (kernels.softmax.split): a row cut into chunks, one block per chunk holding
  it in shared memory; the blocks of a row combine their (max, sum of exp) through
  global memory (one int64 atomic per chunk, a spin wait) and each writes its
  chunk. Reads the row once where block_uncached reads it twice. Needs the device
  to hold a row's blocks at once (checked with the occupancy calculator).
- `auto`: warp for cols <= 1024, else block_smem when it can launch, else split
  when the device can hold a row's blocks at once, else block_uncached; unroll and
  online from the H100 measurements (smem_defaults, uncached_unroll).

Every path loads and stores packs of up to 16 bytes (8 float16 or 4 float32, the
widest that divides cols and suits the pointers' alignment) as one vector access
through kernels.common.packs, and the block paths keep `unroll` packs per thread in flight.
exp is one ex2.approx of x * log2(e) (exp32). Inputs and outputs are float32 or
float16 (they may differ), computation is float32, numerically safe (the row max is
subtracted). Grids follow OneFlow's GetNumBlocks (at most 32 waves of resident
blocks) and kernels stride over rows.

Calls (`softmax`): every launch goes through kernels.common.launch.launch on the caller's
stream (`stream=`, else the input's `__cuda_array_interface__` stream, else the legacy
default stream); device inputs never wait for the device (outputs come from the
stream-ordered pool of kernels.common.devarray). The plan of a call shape is computed once
and kept (`_PLANS`), its launch recorded on a GPU, and a repeated call on a device
array without `out` is replayed without checking again (both in
`kernels.common.replay.TABLE`): a dict lookup, the output's allocation and the launch.
What the softmax and split kernels share (exponentials, pack loader, online normaliser) is in
`kernels.softmax.numerics`, a call's `Plan` in `kernels.softmax.plan`. This module
imports no Numba: the warp kernel is named by `kernels.common.refs.KernelRef` (its
shipped cubins run without Numba), the block and split kernels are imported when a
width needs them.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ..common import replay
from ..common.arrays import (
    as_device_array,
    empty,
    is_device_array,
    overlaps,
    resolve_stream,
    start_address,
    to_device,
    to_host,
)
from ..common.devarray import DeviceArray, cheap_view, empty_like, peek, stream_handle
from ..common.launch import (
    SMEM_LIMIT,
    active_blocks_per_sm,
    allow_dynamic_smem,
    cdiv,
    device_limits,
    largest_block_keeping_occupancy,
    launch,
    launch_or_replay,
    under_compile_lock,
    wave_blocks,
)
from ..common.launch import compile_lock as _COMPILE_LOCK
from ..common.refs import KernelRef
from .plan import Plan

METHODS = ("auto", "warp", "block_smem", "block_uncached", "split")
DTYPES = (np.dtype(np.float32), np.dtype(np.float16))
WARP_MAX_COLS = 1024
WARP_BLOCK = 128  # threads per block of the warp kernel (OneFlow's choice)
UNCACHED_BLOCK = 1024
BLOCK_SIZES = (128, 256, 512, 1024)
WARP_PACK_BYTES = 16  # packs are loaded and stored through kernels.common.packs (128 bits)
BLOCK_PACK_BYTES = 16
UNROLLS = (1, 2, 4)
UNCACHED_BLOCKS_PER_SM = None  # auto: no cap on block_uncached's grid (1 per SM measured no better)
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
_KERNELS = "kernels.softmax.kernels"


def _kernels():
    from . import kernels  # Numba: only where a kernel does not ship

    return kernels


@functools.cache
def warp_kernel(in_dtype, out_dtype, pack, cols_per_thread, width, rows_per_access, padding,
                log) -> KernelRef:  # fmt: skip
    """`kernels.softmax.kernels.warp_kernel` by name: a classifier's softmax runs from
    its shipped binary without importing Numba."""
    args = (np.dtype(in_dtype), np.dtype(out_dtype), pack, cols_per_thread, width,
            rows_per_access, padding, log)  # fmt: skip
    return KernelRef(_KERNELS, "warp_kernel", args)


# ----------------------------------------------------------------------------- planning


def _pack_size(cols: int, dtypes, addresses=(), max_bytes: int = 16) -> int:
    """Largest pack of 8, 4, 2, 1 elements dividing cols, at most max_bytes of the
    widest dtype, and aligned to every address (one per dtype)."""
    widest = max(np.dtype(d).itemsize for d in dtypes)
    for pack in (8, 4, 2):
        if cols % pack or pack * widest > max_bytes:
            continue
        if all(
            a % (pack * np.dtype(d).itemsize) == 0 for a, d in zip(addresses, dtypes, strict=False)
        ):
            return pack
    return 1


def warp_pack_bytes(cols: int, in_dtype) -> int:
    """The warp path's widest load: WARP_PACK_BYTES, but 8 bytes for 2-byte inputs
    wider than 512 columns. H100 (`benchmarks/softmax_bench.py`), float16: 1000
    columns 94.6% of copy with 8-byte packs, 88.2% with 16 (1024 columns 96.2% both;
    32 and 128 columns faster with 16)."""
    if np.dtype(in_dtype).itemsize == 2 and cols > 512:
        return 8
    return WARP_PACK_BYTES


def warp_geometry(rows: int, cols: int, pack: int) -> tuple[int, int, int]:
    """(width, cols_per_thread, rows_per_access) of the warp path, as OneFlow picks them."""
    if cols <= 32 * pack:
        width = 1
        while width * pack < cols:
            width *= 2
        return width, pack, 2 if rows % 2 == 0 else 1
    return 32, cdiv(cols, 32 * pack) * pack, 1


def _block_signature(in_dtype, out_dtype):
    from numba import from_dtype, types

    arr = types.Array
    return (
        arr(from_dtype(np.dtype(in_dtype)), 2, "C"),
        arr(from_dtype(np.dtype(out_dtype)), 2, "C"),
        types.int64,
        types.int64,
    )


def _check_block_size(block_size: int) -> None:
    if block_size % 32 or not 32 <= block_size <= 1024:
        raise ValueError(f"block_size must be a multiple of 32 in 32..1024, got {block_size}")


def smem_defaults(cols: int, in_dtype) -> tuple[int, bool]:
    """(unroll, online) of block_smem under `auto`, from the H100 sweeps
    (`benchmarks/softmax_bench.py`): packs in flight 4 for float32, 2 for float16;
    from 16384 columns on the online variant (one pass over shared memory fewer, and
    a float16 cache half the size, so twice the blocks stay resident): at 32768
    columns 2885 vs 2814 GB/s float32, 2713 vs 2100 float16. Below that the two are
    within 1% for float32 and online is slower for float16 (2048 columns: 2623 vs
    2803)."""
    online = cols >= 16384
    if np.dtype(in_dtype).itemsize == 4:
        return 4, online
    return 2, online


def uncached_unroll(cols: int, pack: int, block: int) -> int:
    """block_uncached's packs in flight per thread: about as many as each thread has
    (H100 sweep: 1 below 2 packs per thread, 2 up to 8, then 4)."""
    per_thread = cols // pack // block
    return 4 if per_thread >= 8 else 2 if per_thread >= 2 else 1


@under_compile_lock
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
    unroll: int | None = None,
    online: bool | None = None,
    blocks_per_sm: int | None = None,
    max_pack_bytes: int | None = None,
    chunks: int | None = None,
) -> tuple[Plan, object]:
    """Choose the path and launch geometry; returns (plan, kernel).

    `block_size` forces the block paths' block size (tests, tuning); `addresses` are
    the input and output device pointers, whose alignment limits the pack size.
    `unroll` (packs in flight per thread), `online` (block_smem caching the input
    and keeping an online sum) and `blocks_per_sm` (block_uncached: at most this many
    blocks per SM in the grid, so fewer rows are in flight and their second read
    hits L2) override the block paths' defaults, `max_pack_bytes` (16, 8, 4 or 2)
    the widest load and store (benchmarks), `chunks` the split path's blocks per row.
    The kernel is a Numba dispatcher launched as `kernels.common.launch.launch(kernel, grid,
    block, (x, y, rows, cols), stream, smem)`; the split path's is a
    kernels.softmax.split.SplitLauncher, which adds its per-stream scratch
    (`launcher.launch(x, y, rows, cols, grid, block, smem, stream)`). `launch_plan`
    launches either. Thread-safe (under kernels.common.launch's compile lock).
    Raises ValueError when the requested method cannot run this width.
    """
    in_dtype = np.dtype(in_dtype)
    out_dtype = in_dtype if out_dtype is None else np.dtype(out_dtype)
    if method not in METHODS:
        raise ValueError(f"unknown softmax method {method!r}; choose one of {', '.join(METHODS)}")
    if block_size is not None:
        _check_block_size(block_size)
    if unroll is not None and unroll not in UNROLLS:
        raise ValueError(f"unroll must be one of {UNROLLS}, got {unroll}")
    dtypes = (in_dtype, out_dtype)
    log = bool(log)

    if method == "warp" or (method == "auto" and cols <= WARP_MAX_COLS):
        if cols > WARP_MAX_COLS:
            raise ValueError(f"method 'warp' handles cols <= {WARP_MAX_COLS}, got {cols}")
        widest = max_pack_bytes or warp_pack_bytes(cols, in_dtype)
        pack = _pack_size(cols, dtypes, addresses, widest)
        width, cpt, rpa = warp_geometry(rows, cols, pack)
        groups = WARP_BLOCK // width
        grid = wave_blocks(WARP_BLOCK, cdiv(cdiv(rows, rpa), groups))
        padding = cols != cpt * width
        kernel = warp_kernel(in_dtype, out_dtype, pack, cpt, width, rpa, padding, log)
        return Plan("warp", pack, grid, (width, groups), 0, width, cpt, rpa), kernel

    pack = _pack_size(cols, dtypes, addresses, max_pack_bytes or BLOCK_PACK_BYTES)
    if method == "split":
        return _plan_split(rows, cols, in_dtype, out_dtype, pack, log, block_size, unroll, chunks)
    # auto: block_smem whenever it can launch (it beat block_uncached at every width
    # measured where both run), else split (one read of the row instead of two) when
    # the device holds a row's blocks at once, else block_uncached.
    path = "block_smem" if method == "auto" else method
    if path == "block_smem":
        default_unroll, default_online = smem_defaults(cols, in_dtype)
        online = default_online if online is None else bool(online)
        unroll = unroll or default_unroll
        smem = cols * (in_dtype.itemsize if online else 4)
        kernel = _kernels().block_smem_kernel(in_dtype, out_dtype, pack, unroll, log, online)
        size = block_size
        if SIMULATOR and smem > SMEM_LIMIT:
            size = 0  # the simulator cannot be asked for more (no opt-in attribute)
        elif size is None or smem > SMEM_LIMIT:
            compiled = kernel.compile(_block_signature(in_dtype, out_dtype))
            if not allow_dynamic_smem(compiled, smem):
                size = 0
            elif size is None:
                size = largest_block_keeping_occupancy(
                    lambda bs: active_blocks_per_sm(compiled, bs, smem), BLOCK_SIZES
                )
        if size:
            grid = wave_blocks(size, rows)
            return Plan("block_smem", pack, grid, (size, 1), smem, unroll=unroll, online=online), (
                kernel
            )
        if method == "block_smem":
            raise ValueError(
                f"method 'block_smem' cannot launch: a row of {cols} columns needs {smem} "
                "bytes of shared memory, more than this device gives a block"
            )
        try:
            return _plan_split(rows, cols, in_dtype, out_dtype, pack, log, block_size, None, chunks)
        except ValueError:
            pass
        unroll = None

    size = block_size or UNCACHED_BLOCK
    unroll = unroll or uncached_unroll(cols, pack, size)
    kernel = _kernels().block_uncached_kernel(in_dtype, out_dtype, pack, unroll, log)
    grid = wave_blocks(size, rows)
    if blocks_per_sm is None and method == "auto":
        blocks_per_sm = UNCACHED_BLOCKS_PER_SM
    if blocks_per_sm:
        grid = max(1, min(grid, device_limits()[0] * blocks_per_sm))
    return Plan("block_uncached", pack, grid, (size, 1), unroll=unroll), kernel


def _plan_split(rows, cols, in_dtype, out_dtype, pack, log, block_size, unroll, chunks):
    from .split import plan_split

    return plan_split(
        rows,
        cols,
        in_dtype,
        out_dtype,
        pack,
        log,
        block_size=block_size,
        unroll=unroll,
        chunks=chunks,
    )


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
    if dtype not in _DTYPE_SET:
        raise TypeError(f"{name} must be float32 or float16, got {np.dtype(dtype)}")


_DTYPE_SET = frozenset(DTYPES)


def _c_contiguous(arr) -> bool:
    """Rows of consecutive elements, one after another (DeviceArray has it as a
    property, Numba's arrays as a method)."""
    flag = arr.is_c_contiguous
    return flag if flag is True or flag is False else bool(flag())


def _device_view(obj, name: str):
    """A launchable view of a device array argument (kernels.common.arrays), checked."""
    arr = as_device_array(obj)
    _validate(arr, name)
    if not _c_contiguous(arr):
        raise ValueError(f"{name} must be C-contiguous (rows of consecutive elements)")
    return arr


# Call shape -> (kernel, grid, block, smem, split launcher or None): the plan as
# launch() takes it; kernels.common.replay keeps, under ("softmax", key), its launch once
# recorded on a GPU (launch_or_replay: parameters packed once, the pointers patched
# per call). Read without the lock (one dict lookup); filled and trimmed under
# kernels.common.launch's compile lock, which plan() holds (Numba compiles there).
_PLANS: dict[tuple, tuple] = {}
_PLANS_KEEP = 256


def _entry(key: tuple, rows: int, cols: int, dx, dy, log: bool, method: str, block_size):
    with _COMPILE_LOCK:
        hit = _PLANS.get(key)
        if hit is not None:
            return hit
        how, kernel = plan(
            rows,
            cols,
            dx.dtype,
            dy.dtype,
            log=log,
            method=method,
            block_size=block_size,
            addresses=(start_address(dx), start_address(dy)),
        )
        hit = _launch_entry(how, kernel)
        if len(_PLANS) >= _PLANS_KEEP:
            _PLANS.pop(next(iter(_PLANS)))
        _PLANS[key] = hit
    return hit


def _launch_entry(how: Plan, kernel) -> tuple:
    grid = (int(how.grid), 1, 1)
    block = (int(how.block[0]), int(how.block[1]), 1)
    split = kernel if how.method == "split" else None
    return (None if split else kernel), grid, block, int(how.smem), split


def launch_plan(how: Plan, kernel, x, y, stream=None) -> None:
    """Queue one launch of a plan from plan() (`kernel` its second item) on device
    arrays x and y (C-contiguous, x's shape; anything softmax() takes as a device
    array) on `stream` (softmax()'s rule), and return at once. For tests, benchmarks
    and profiling: softmax() does this with plans kept per call shape."""
    dx, dy = as_device_array(x), as_device_array(y)
    rows, cols = (int(n) for n in dx.shape)
    fn, grid, block, smem, split = _launch_entry(how, kernel)
    handle = resolve_stream(stream, dx)
    if split is None:
        launch(fn, grid, block, (dx, dy, rows, cols), handle, smem)
    else:
        split.launch(dx, dy, rows, cols, grid, block, smem, handle)


def softmax(
    x,
    *,
    log: bool = False,
    method: str = "auto",
    out=None,
    block_size: int | None = None,
    stream=None,
):
    """Softmax (or log-softmax with log=True) of each row of a 2-D float array.

    x: (rows, cols) float32 or float16, a NumPy array or a C-contiguous device array
    (a kernels.common.devarray.DeviceArray, or anything with __cuda_array_interface__: CuPy,
    PyTorch, Numba). Returns an array of x's shape and dtype: for a device input a
    DeviceArray (on Numba's simulator, its array), queued on the stream and returned
    at once, without waiting for the device; for a host input a NumPy array (copied
    in, computed and copied back on the stream, then synchronised).

    out: host or device array of x's shape, float32 or float16 (e.g. float16 in and
    float32 out), not overlapping x; the result is written there and `out` is
    returned. stream: a CuPy, PyTorch, Numba or cuda.core stream or a CUstream
    handle; without it the stream of x's __cuda_array_interface__ (PyTorch: its
    current stream), else CUDA's legacy default stream (kernels.common.devarray). Device
    arrays used on another stream than the one they were written on are the
    caller's to order (as with CuPy and PyTorch).

    method: "auto", "warp", "block_smem", "block_uncached" or "split" (see the module
    docstring). block_size forces the block paths' threads per block. Thread-safe.
    """
    replay_key = None
    if out is None:
        seen = peek(x, stream is None)
        if seen is not None:
            layout, ptr, own_stream = seen
            replay_key = ("softmax call", layout, ptr & 15, log, method, block_size)
            fast = replay.TABLE.get(replay_key)
            if fast is not None:
                recipe, template = fast
                handle = own_stream if stream is None else stream_handle(stream)
                dy = empty_like(template, handle)
                recipe.replay([ptr, dy.ptr], handle)
                return dy
            x = cheap_view(x)
    return _softmax(x, log, method, out, block_size, stream, replay_key)


def _softmax(x, log, method: str, out, block_size, stream, replay_key):
    """softmax's general path: checks, plans, records, replays; a recorded call is
    filed under `replay_key` (None: not filed)."""
    if method not in METHODS:
        raise ValueError(f"unknown softmax method {method!r}; choose one of {', '.join(METHODS)}")
    if type(x) is DeviceArray:  # the common case on a GPU, checked inline
        dx = x
        if len(x.shape) != 2 or x.dtype not in _DTYPE_SET or not x.is_c_contiguous:
            _device_view(x, "x")  # raises the error that names the problem
        host_x = None
    elif is_device_array(x):
        dx = _device_view(x, "x")
        host_x = None
    elif isinstance(x, np.ndarray):
        _validate(x, "x")
        dx = None
        host_x = x
    else:
        raise TypeError(f"x must be a NumPy or device array, got {_describe(x)}")
    shape = (dx if dx is not None else host_x).shape
    rows, cols = shape
    dout = host_out = None
    if out is not None:
        if type(out) is DeviceArray:
            dout = out
            if len(out.shape) != 2 or out.dtype not in _DTYPE_SET or not out.is_c_contiguous:
                _device_view(out, "out")
        elif is_device_array(out):
            dout = _device_view(out, "out")
        elif isinstance(out, np.ndarray):
            _validate(out, "out")
            host_out = out
        else:
            raise TypeError(f"out must be a NumPy or device array, got {_describe(out)}")
        out_shape = (dout if dout is not None else host_out).shape
        if out_shape != shape:
            raise ValueError(f"out has shape {tuple(out_shape)}, x has {tuple(shape)}")
        if dout is not None and dx is not None:
            if type(dx) is DeviceArray and type(dout) is DeviceArray:
                # Both C-contiguous: [ptr, ptr + nbytes) each.
                lo, hi = dout.ptr, dout.ptr + dout.size * dout.dtype.itemsize
                clash = lo < dx.ptr + dx.size * dx.dtype.itemsize and dx.ptr < hi
            else:
                clash = overlaps(dx, dout)
        else:
            clash = host_x is not None and host_out is not None
            clash = clash and np.may_share_memory(host_x, host_out)
        if clash:
            raise ValueError(
                "out overlaps x: softmax cannot work in place (the block and split paths "
                "read x again after writing); give an out that shares no memory with x"
            )
    if stream is None and type(dx) is DeviceArray:
        handle = dx.stream
    else:
        handle = resolve_stream(stream, dx, dout)
    if dout is not None:
        out_dtype = dout.dtype
    elif host_out is not None:
        out_dtype = host_out.dtype
    else:
        out_dtype = (dx if dx is not None else host_x).dtype
    if host_x is not None and not (rows and cols):
        if host_out is None and dout is None:
            return np.empty((rows, cols), out_dtype)
        return out
    if dx is None:
        dx = to_device(host_x, handle)
    dy = dout if dout is not None else empty((rows, cols), out_dtype, handle)

    if rows and cols:
        log = bool(log)
        if type(dx) is DeviceArray and type(dy) is DeviceArray:
            px, py = dx.ptr, dy.ptr
        else:
            px, py = start_address(dx), start_address(dy)
        key = (rows, cols, dx.dtype, dy.dtype, log, method, block_size, px & 15, py & 15)
        hit = _PLANS.get(key)
        if hit is None:
            hit = _entry(key, rows, cols, dx, dy, log, method, block_size)
        kernel, grid, block, smem, split = hit
        if split is None:
            slots, args = (dx, dy), (dx, dy, rows, cols)
        else:
            if rows != split.rows:
                raise ValueError(f"this split launcher is for {split.rows} rows, got {rows}")
            counters, partials = split.scratch(handle)
            kernel = split.kernel
            slots, args = (dx, dy, counters, partials), (dx, dy, rows, cols, counters, partials)
        recipe_key = ("softmax", key)
        launch_or_replay(recipe_key, slots, kernel, grid, block, args, handle, smem)
        if replay_key is not None and split is None and py & 511 == 0:
            recipe = replay.TABLE.get(recipe_key)
            if recipe is not None:
                replay.keep_call(replay_key, dy, recipe)

    if out is None:
        return dy if host_x is None else to_host(dy, handle)
    if host_out is not None:
        host_out[...] = to_host(dy, handle)
    return out


def log_softmax(x, *, method: str = "auto", out=None, block_size: int | None = None, stream=None):
    """softmax(x, log=True, ...): log of the softmax of each row, computed stably."""
    return softmax(x, log=True, method=method, out=out, block_size=block_size, stream=stream)
