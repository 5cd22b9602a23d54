"""Device arrays as the kernels' launch functions take them (Numba-free at import).

On a GPU these are `kernels.common.devarray.DeviceArray` views, allocated from its
stream-ordered pool; on Numba's CUDA simulator (the test suite without a GPU) they are
the simulator's arrays, which the kernels run on through Numba. The functions here
hide the difference, so the same launch code serves both.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import devarray
from .devarray import LEGACY, DeviceArray

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def is_numba_device_array(obj: Any) -> bool:
    """Numba's own device arrays, including the simulator's (which lack the interface)."""
    return type(obj).__module__.startswith("numba.cuda") and hasattr(obj, "copy_to_host")


def is_device_array(obj: Any) -> bool:
    """True for GPU arrays: ours, Numba's, anything with `__cuda_array_interface__`
    (CuPy, torch CUDA tensors), and DLPack producers of CUDA memory (JAX)."""
    kind = type(obj)
    if kind is DeviceArray:
        return True
    module = kind.__module__
    if module == "cupy" or module.startswith("cupy._core"):
        return True  # without building its interface dict (hasattr would)
    if module == "torch":
        return bool(getattr(obj, "is_cuda", False))
    return (is_numba_device_array(obj) or hasattr(obj, "__cuda_array_interface__")
            or devarray.is_dlpack_device_array(obj))  # fmt: skip


def as_device_array(obj: Any):
    """A view of a device array that the launch functions take, without copying or
    waiting: a DeviceArray on a GPU, a Numba array on the simulator."""
    if SIMULATOR:
        if is_numba_device_array(obj):
            return obj
        from numba import cuda

        return cuda.as_cuda_array(obj)
    return devarray.as_device_array(obj)


def empty(shape: tuple, dtype, stream: int = LEGACY):
    """An uninitialised C-contiguous device array ordered on `stream`."""
    if SIMULATOR:
        from numba import cuda

        return cuda.device_array(shape, dtype=dtype)
    return devarray.empty(tuple(shape), dtype, stream)


def empty_like(arr: Any, stream: int = LEGACY):
    """`empty(arr.shape, arr.dtype, stream)` for a C-contiguous device array."""
    if SIMULATOR:
        from numba import cuda

        return cuda.device_array(arr.shape, dtype=arr.dtype)
    return devarray.empty_like(arr, stream)


def to_device(host: np.ndarray, stream: int = LEGACY):
    """A device copy of a host array, queued on `stream`."""
    if SIMULATOR:
        from numba import cuda

        return cuda.to_device(np.ascontiguousarray(host))
    return devarray.to_device(host, stream)


def to_host(arr, stream: int = LEGACY) -> np.ndarray:
    """The device array's contents as a NumPy array, after the work queued on `stream`."""
    if SIMULATOR:
        return arr.copy_to_host()
    return arr.copy_to_host(stream=stream)


def resolve_stream(stream: Any, *arrays: Any) -> int:
    """The CUstream handle a call runs on (`kernels.common.devarray.resolve_stream`); 0 on
    the simulator, which runs everything in order."""
    if SIMULATOR:
        if stream is not None:
            devarray.stream_handle(stream)  # the same TypeError for a non-stream
        return LEGACY
    return devarray.resolve_stream(stream, *arrays)


def start_address(obj: Any) -> int:
    """The address of a device array's first element (on the simulator, of the NumPy
    array it wraps: the offsets of views are the same)."""
    if type(obj) is DeviceArray:
        return obj.ptr
    try:
        return int(obj.__cuda_array_interface__["data"][0])
    except AttributeError:
        return int(obj.__array_interface__["data"][0])


def is_c_contiguous(arr: Any) -> bool:
    """Row-major without gaps (a property of DeviceArray, a method of Numba's arrays)."""
    flag = arr.is_c_contiguous
    return flag if isinstance(flag, bool) else bool(flag())


def overlaps(a: Any, b: Any) -> bool:
    """Whether two device arrays share any byte (by their address ranges)."""
    lo_a, hi_a = _extent(a)
    lo_b, hi_b = _extent(b)
    return lo_a < hi_b and lo_b < hi_a


def _extent(arr: Any) -> tuple[int, int]:
    if type(arr) is DeviceArray and arr.is_c_contiguous:
        return arr.ptr, arr.ptr + arr.nbytes
    start = start_address(arr)
    itemsize = np.dtype(arr.dtype).itemsize
    if arr.size == 0:
        return start, start
    lo = hi = start
    for n, s in zip(arr.shape, arr.strides, strict=True):
        if s >= 0:
            hi += (n - 1) * s
        else:
            lo += (n - 1) * s
    return lo, hi + itemsize


def copy_rows(dst: Any, src: Any, stream: int = LEGACY) -> None:
    """Copy the C-contiguous device array `src` into `dst` (same shape and dtype),
    queued on `stream`."""
    if SIMULATOR:
        dst.copy_to_device(src)
        return
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise ValueError(f"cannot copy {src.shape} {src.dtype} into {dst.shape} {dst.dtype}")
    devarray.driver().copy(dst.ptr, src.ptr, src.nbytes, stream)


def batched_view(arr: Any, n: int, step: int):
    """`arr` (a view into the first image of a batch) as n arrays `step` bytes apart:
    shape (n, *arr.shape), a view of the same memory (no copy, no bounds check: the
    caller knows the batch holds n images)."""
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        host = arr._ary
        view = np.lib.stride_tricks.as_strided(
            host, shape=(n, *host.shape), strides=(step, *host.strides)
        )
        return FakeCUDAArray(view)
    return DeviceArray(arr.ptr, (n, *arr.shape), arr.dtype, (step, *arr.strides), arr.stream,
                       arr._base())  # fmt: skip


def extent(arr: Any) -> tuple[int, int]:
    """(first, past the last) byte address a device array covers."""
    return _extent(arr)


# Where the address spaces of var-shape launches start (`address_space`) on a GPU:
# below any device allocation, so that every array's offset from it is positive.
SPACE_BASE = 1 << 16
_SPACES: dict = {}


def address_space(dtype, extents: list) -> tuple[Any, int]:
    """(array, base): a 1-D device array of `dtype` whose element 0 lies at address
    `base` and which covers every (first, past) byte range of `extents`, for kernels
    that view each image's array in it by element offsets (`kernels.common.launch`'s
    var-shape launches). On a GPU one array per dtype spans the whole address space
    (no memory is allocated; only the images' ranges are ever read or written); on
    the simulator, a view of host memory over the ranges."""
    dtype = np.dtype(dtype)
    if not SIMULATOR:
        space = _SPACES.get(dtype)
        if space is None:
            n = ((1 << 56) - SPACE_BASE) // dtype.itemsize
            space = _SPACES[dtype] = DeviceArray(SPACE_BASE, (n,), dtype)
        return space, SPACE_BASE
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    from .cudadrv import host_bytes

    lo = min(first for first, _ in extents)
    lo -= lo % dtype.itemsize
    hi = max(past for _, past in extents)
    n = -(-(hi - lo) // dtype.itemsize)
    host = host_bytes(lo, n * dtype.itemsize).view(dtype)
    return FakeCUDAArray(host), lo


def empty_many(shapes: list, dtypes: list, stream: int = LEGACY) -> list:
    """Uninitialised C-contiguous device arrays of these shapes and dtypes, ordered on
    `stream`: on a GPU views of one pool allocation (each 256-byte aligned; the
    allocation is kept until the last of them is collected)."""
    if SIMULATOR:
        return [empty(shape, dtype, stream) for shape, dtype in zip(shapes, dtypes, strict=True)]
    key = (tuple(shapes), tuple(dtypes))
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _layout(shapes, dtypes)
        if len(_LAYOUTS) >= 64:
            _LAYOUTS.clear()
        _LAYOUTS[key] = layout
    total, templates = layout
    block = devarray.POOL.allocate(total, stream)
    base, arrays, new = block.ptr, [], object.__new__
    for at, template in templates:
        a = new(DeviceArray)
        a.shape, a.strides, a.dtype, a.size, a._sig = template
        a.ptr, a.stream, a._owner = base + at, stream, block
        arrays.append(a)
    return arrays


_LAYOUTS: dict = {}  # empty_many's layouts by shapes and dtypes


def _layout(shapes: list, dtypes: list) -> tuple[int, list]:
    """(bytes in all, [(offset, (shape, strides, dtype, size, type signature))]) of
    C-contiguous arrays laid out one after the other, 256-byte aligned."""
    templates, total = [], 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        a = devarray.c_array(0, tuple(shape), np.dtype(dtype), LEGACY, None)
        templates.append((total, (a.shape, a.strides, a.dtype, a.size, a._sig)))
        total += -(-max(a.nbytes, 1) // 256) * 256
    return total, templates
