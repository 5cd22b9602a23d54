"""A minimal CUDA driver API client (ctypes), for launching cubins without Numba.

Importing Numba's CUDA target costs over a second; a command that only needs to run
kernels compiled on an earlier run can skip it by loading their cubins here. Only
what that needs: the primary context of device 0, module loading, device memory,
copies, launches. Every failure raises `DriverError` with the CUDA error name.

Numba passes each array argument of a kernel as these parameters, in order (see
`array_params`): meminfo and parent (null pointers here), the element count, the item
size, the data pointer, then the shape and the strides in bytes, all 64-bit.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # NumPy is imported where needed: the driver may open before it loads
    import numpy as np

_LIBS = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")
_ATTR_CC_MAJOR, _ATTR_CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*
_ATTR_MAX_DYNAMIC_SMEM = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_SMEM_DEFAULT = 48 * 1024  # dynamic shared memory a launch gets without opting in


class DriverError(RuntimeError):
    """A CUDA driver call failed (or no driver is installed)."""


class Driver:
    """Device 0 through its primary context; one per process is enough. Any thread
    may call it: the context is made current in each thread before its first call."""

    def __init__(self) -> None:
        self._lib = None
        for name in _LIBS:
            try:
                self._lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if self._lib is None:
            raise DriverError("no CUDA driver library found")
        self._call("cuInit", ctypes.c_uint(0))
        dev = ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(0))
        self.device = dev
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._call("cuDeviceGetAttribute", ctypes.byref(major), _ATTR_CC_MAJOR, dev)
        self._call("cuDeviceGetAttribute", ctypes.byref(minor), _ATTR_CC_MINOR, dev)
        self.cc = (major.value, minor.value)
        self._ctx = ctypes.c_void_p()
        self._tls = threading.local()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(self._ctx), dev)
        self.make_current()
        self._modules: list = []

    def make_current(self) -> None:
        """Bind the context to the calling thread (it was bound to the opening one)."""
        self._check("cuCtxSetCurrent", self._lib.cuCtxSetCurrent(self._ctx))
        self._tls.current = True

    def _call(self, name: str, *args) -> None:
        ctx = getattr(self, "_ctx", None)
        if ctx is not None and ctx.value and not getattr(self._tls, "current", False):
            self.make_current()
        self._check(name, getattr(self._lib, name)(*args))

    def _check(self, name: str, status: int) -> None:
        if status != 0:
            text = ctypes.c_char_p()
            self._lib.cuGetErrorName(status, ctypes.byref(text))
            label = text.value.decode() if text.value else str(status)
            raise DriverError(f"{name} failed: {label}")

    def function(self, cubin: bytes, entry: str) -> ctypes.c_void_p:
        """Load a cubin image and return its kernel named `entry`."""
        module = ctypes.c_void_p()
        self._call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(cubin))
        self._modules.append(module)
        fn = ctypes.c_void_p()
        self._call("cuModuleGetFunction", ctypes.byref(fn), module, entry.encode())
        return fn

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1)))
        return ptr.value

    def free(self, ptr: int) -> None:
        self._call("cuMemFree_v2", ctypes.c_uint64(ptr))

    def to_device(self, host: np.ndarray) -> int:
        """A new device copy of a C-contiguous host array; returns its pointer."""
        ptr = self.alloc(host.nbytes)
        self._call(
            "cuMemcpyHtoD_v2", ctypes.c_uint64(ptr), host.ctypes.data_as(ctypes.c_void_p),
            ctypes.c_size_t(host.nbytes),
        )  # fmt: skip
        return ptr

    def to_host(self, ptr: int, out: np.ndarray) -> np.ndarray:
        """Copy out.nbytes from the device pointer into the C-contiguous array `out`."""
        self._call(
            "cuMemcpyDtoH_v2", out.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(ptr),
            ctypes.c_size_t(out.nbytes),
        )  # fmt: skip
        return out

    def launch(self, fn, grid: Sequence[int], block: Sequence[int], smem: int, params) -> None:
        """Launch on the default stream and wait; `params` are ctypes values in order.
        More than 48 KiB of dynamic shared memory is opted in to first."""
        if smem > _SMEM_DEFAULT:
            self._call("cuFuncSetAttribute", fn, _ATTR_MAX_DYNAMIC_SMEM, ctypes.c_int(smem))
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        pointers = (ctypes.c_void_p * len(params))(
            *[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params]
        )
        dims = [ctypes.c_uint(v) for v in (*grid, *block)]
        self._call(
            "cuLaunchKernel", fn, *dims, ctypes.c_uint(smem), ctypes.c_void_p(0), pointers,
            ctypes.c_void_p(0),
        )  # fmt: skip
        self._call("cuCtxSynchronize")


def array_params(ptr: int, shape: tuple, dtype) -> list:
    """The kernel parameters Numba passes for a C-contiguous array argument."""
    import numpy as np

    itemsize = np.dtype(dtype).itemsize
    strides = []
    step = itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    strides.reverse()
    return [
        ctypes.c_void_p(0),  # meminfo
        ctypes.c_void_p(0),  # parent
        ctypes.c_int64(int(np.prod(shape, dtype=np.int64))),
        ctypes.c_int64(itemsize),
        ctypes.c_void_p(ptr),
        *[ctypes.c_int64(n) for n in shape],
        *[ctypes.c_int64(s) for s in strides],
    ]


def scalar_param(value):
    """A scalar kernel parameter typed as Numba types it: Python int and np.int64 as
    int64, other NumPy integers as themselves, np.float32 as float32, Python float as
    float64, bool as a one-byte boolean."""
    import numpy as np

    if isinstance(value, np.float32):
        return ctypes.c_float(float(value))
    if isinstance(value, float | np.float64):
        return ctypes.c_double(float(value))
    if isinstance(value, bool | np.bool_):
        return ctypes.c_bool(bool(value))
    if isinstance(value, np.integer) and value.dtype != np.int64:
        return getattr(ctypes, f"c_{value.dtype.name}")(int(value))
    if isinstance(value, int | np.integer):
        return ctypes.c_int64(int(value))
    raise TypeError(f"unsupported kernel parameter {value!r}")
