"""The CUDA driver API through NVIDIA's `cuda.bindings`: the one launch and memory
layer of the package.

Numba compiles the kernels; this module runs them. Everything a call needs per launch
(kernel launch, stream-ordered copies, allocation) is a direct driver call here, so a
call costs microseconds of Python, never waits for the device unless asked to, and
works on any stream a caller names (streams, functions and pointers are plain ints).
Numba-free: the quick start (`imgfilter.backends.cached`) uses it without importing
Numba.

Contexts: the primary context of device 0, made current in every thread that calls
in (`current`). Every driver failure raises `CudaError` carrying the CUDA error name;
out of memory raises `GpuOutOfMemory` (a `MemoryError`).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

SMEM_DEFAULT = 48 * 1024  # dynamic shared memory a launch gets without opting in
_OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
_NOT_READY = 600  # CUDA_ERROR_NOT_READY
_ATTR_CC_MAJOR, _ATTR_CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*
_ATTR_MAX_DYNAMIC_SMEM = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES

# cuLaunchKernel's `extra` markers: the parameters as one packed buffer.
_PARAM_END, _PARAM_BUFFER_POINTER, _PARAM_BUFFER_SIZE = 0, 1, 2
_PARAM_BYTES = 4096  # CUDA's limit on kernel parameters (older GPUs) fits
# Files whose presence says an NVIDIA driver may be installed (Linux device nodes,
# WSL's GPU node); elsewhere the driver is asked.
_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg")


class CudaError(RuntimeError):
    """A CUDA driver call failed (or no driver is installed). `code` is the CUresult."""

    def __init__(self, message: str, code: int = -1) -> None:
        super().__init__(message)
        self.code = code


class GpuOutOfMemory(CudaError, MemoryError):
    """The GPU could not give the memory a call needs."""


class NoMemoryForContext(GpuOutOfMemory):
    """The GPU had not even the memory to open a CUDA context."""


def address(arr: np.ndarray) -> int:
    """The address of a NumPy array's first byte (host memory)."""
    return arr.__array_interface__["data"][0]


class _HostMemory:
    """`nbytes` of host memory at `address`, as NumPy sees a buffer (its array interface)."""

    def __init__(self, at: int, nbytes: int) -> None:
        self.__array_interface__ = {
            "data": (at, False), "shape": (nbytes,), "typestr": "|u1", "version": 3,
        }  # fmt: skip


def host_bytes(at: int, nbytes: int) -> np.ndarray:
    """A writable uint8 array over `nbytes` of host memory at address `at` (memory this
    process owns, e.g. from `Driver.host_alloc`); it does not own or free it."""
    return np.asarray(_HostMemory(at, nbytes))


class _ThreadState(threading.local):
    """A thread's launch state (`Driver.current`). `ready` has a class default because
    reading an unset attribute of a threading.local raises and catches AttributeError
    (a third of a microsecond, on every launch)."""

    ready = False


def _extra(params: np.ndarray, size: np.ndarray) -> np.ndarray:
    """cuLaunchKernel's `extra` array: the parameters as one buffer of `size[0]` bytes."""
    return np.array([_PARAM_BUFFER_POINTER, address(params), _PARAM_BUFFER_SIZE,
                     address(size), _PARAM_END], np.uint64)  # fmt: skip


def driver_present() -> bool:
    """Whether an NVIDIA driver may be installed: a look at the device nodes (no CUDA
    call, no library loaded); True where there is nothing to look at (then the driver
    itself answers)."""
    if sys.platform.startswith("linux"):
        return any(os.path.exists(node) for node in _DEVICE_NODES)
    return True


def _bindings():
    """NVIDIA's driver bindings (`cuda.bindings.driver`), or CudaError without them."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as exc:  # numba-cuda installs them; a broken environment
        raise CudaError(f"the CUDA driver bindings are not installed ({exc}): "
                        "pip install cuda-bindings") from None  # fmt: skip
    return cu


class Driver:
    """Device 0's primary context and the calls the package makes. Thread-safe: the
    context is made current in each calling thread before its first call. The calls
    go through `cuda.bindings.driver` (`self._cu`), which releases the GIL in each."""

    def __init__(self) -> None:
        cu = _bindings()
        self._cu = cu
        try:
            (status,) = cu.cuInit(0)
        except Exception:  # the bindings found no libcuda to load
            raise CudaError(
                "no NVIDIA driver found (libcuda): GPU work (device arrays, kernels.softmax, "
                "kernels.linalg.gemv, the cuda backend) needs an NVIDIA GPU and its driver"
            ) from None
        if status:
            raise CudaError(f"no usable NVIDIA GPU (cuInit: {self.error_name(status)})", status)
        self.device = self.call("cuDeviceGet", 0)
        self.cc = (self.attribute(_ATTR_CC_MAJOR), self.attribute(_ATTR_CC_MINOR))
        status, context = cu.cuDevicePrimaryCtxRetain(self.device)
        if status == _OOM:
            raise NoMemoryForContext(context_memory_message(cu, self.device), status)
        self.check(status, "cuDevicePrimaryCtxRetain")
        self.context = context
        self._tls = _ThreadState()
        self._smem_opted: set = set()
        self.current()

    # ------------------------------------------------------------------ basics
    def attribute(self, code: int) -> int:
        """cuDeviceGetAttribute of the device (a CUdevice_attribute code)."""
        return self.call("cuDeviceGetAttribute", self._cu.CUdevice_attribute(code), self.device)

    def name(self) -> str:
        """The device's name, as cuDeviceGetName gives it (e.g. "NVIDIA H100 80GB HBM3")."""
        raw = self.call("cuDeviceGetName", 256, self.device)
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def error_name(self, status: int) -> str:
        status_, text = self._cu.cuGetErrorName(status)
        return text.decode() if not status_ and text else str(int(status))

    def check(self, status: int, name: str) -> None:
        if status != 0:
            label = self.error_name(status)
            cls = GpuOutOfMemory if status == _OOM else CudaError
            raise cls(f"{name} failed: {label}", int(status))

    def call(self, name: str, *args) -> Any:
        """Call driver function `name`; return its one result (or a tuple of several,
        or None), raising CudaError when it fails."""
        status, *results = getattr(self._cu, name)(*args)
        self.check(status, name)
        if not results:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    def current(self) -> None:
        """Make the context current in the calling thread (once per thread)."""
        tls = self._tls
        if tls.ready:
            return
        self._cu.cuCtxSetCurrent(self.context)
        tls.ready = True
        tls.params = np.zeros(_PARAM_BYTES, np.uint8)
        tls.size = np.zeros(1, np.uint64)
        tls.extra = _extra(tls.params, tls.size)
        tls.extra_address = address(tls.extra)
        tls.configs = {}

    def free_and_total(self) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        self.current()
        return self.call("cuMemGetInfo")

    # ------------------------------------------------------------------ memory
    def alloc(self, nbytes: int) -> int:
        """cuMemAlloc: no wait for the device. Raises GpuOutOfMemory."""
        self.current()
        return int(self.call("cuMemAlloc", max(nbytes, 1)))

    def free(self, ptr: int) -> None:
        """cuMemFree: waits for the device; only the pool's trim calls it."""
        self.current()
        self.call("cuMemFree", ptr)

    def upload(self, ptr: int, host_address: int, nbytes: int, stream: int) -> None:
        """Copy host bytes to the device in `stream`'s order. From pageable memory the
        driver stages the bytes before returning (the host buffer may then change) and
        does not wait for the device."""
        self.current()
        self.call("cuMemcpyHtoDAsync", ptr, host_address, nbytes, stream)

    def download(self, host_address: int, ptr: int, nbytes: int, stream: int) -> None:
        """Copy device bytes to the host in `stream`'s order, then wait for the stream
        (the bytes are in place on return)."""
        self.download_async(host_address, ptr, nbytes, stream)
        self.synchronize(stream)

    def download_async(self, host_address: int, ptr: int, nbytes: int, stream: int) -> None:
        """Copy device bytes to pinned host memory in `stream`'s order, without waiting:
        the bytes are in place once the stream has reached the copy."""
        self.current()
        self.call("cuMemcpyDtoHAsync", host_address, ptr, nbytes, stream)

    def host_alloc(self, nbytes: int) -> int:
        """Page-locked host memory (cuMemHostAlloc, portable): what copies overlap with
        kernels from. Raises GpuOutOfMemory when it cannot be had."""
        self.current()
        return int(self.call("cuMemHostAlloc", max(nbytes, 1), 1))

    def host_free(self, at: int) -> None:
        self.current()
        self.call("cuMemFreeHost", at)

    def stream_create(self) -> int:
        """A new stream that does not synchronise with the legacy default stream."""
        self.current()
        return int(self.call("cuStreamCreate", 1))  # CU_STREAM_NON_BLOCKING

    def stream_destroy(self, handle: int) -> None:
        self.current()
        self.call("cuStreamDestroy", handle)

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.current()
        self.call("cuMemcpyDtoDAsync", dst, src, nbytes, stream)

    def memset(self, ptr: int, byte: int, nbytes: int, stream: int) -> None:
        self.current()
        self.call("cuMemsetD8Async", ptr, byte, nbytes, stream)

    def idle(self, stream: int) -> bool:
        """Whether every piece of work queued on `stream` has finished (no waiting)."""
        self.current()
        (status,) = self._cu.cuStreamQuery(stream)
        if status == _NOT_READY:
            return False
        self.check(status, "cuStreamQuery")
        return True

    def capturing(self, stream: int) -> bool:
        """Whether `stream` is being captured into a CUDA graph (cuStreamIsCapturing)."""
        self.current()
        return int(self.call("cuStreamIsCapturing", stream)) != 0  # STATUS_NONE is 0

    def synchronize(self, stream: int) -> None:
        self.current()
        self.call("cuStreamSynchronize", stream)

    # ------------------------------------------------------------------ kernels
    def function(self, image: bytes, entry: str) -> int:
        """Load a module image (a cubin or fatbin) and return its kernel `entry` as a
        CUfunction address. The module stays loaded for the life of the process."""
        self.current()
        module = self.call("cuModuleLoadData", image)
        return int(self.call("cuModuleGetFunction", module, entry.encode()))

    def opt_in_smem(self, fn: int, nbytes: int, library_kernel: bool = False) -> None:
        """Let `fn` take more than 48 KiB of dynamic shared memory; once per function
        and size. `library_kernel`: fn is a CUkernel (what Numba loads), not a
        CUfunction from `function`."""
        key = (fn, nbytes)
        if nbytes <= SMEM_DEFAULT or key in self._smem_opted:
            return
        self.current()
        attr = self._cu.CUfunction_attribute(_ATTR_MAX_DYNAMIC_SMEM)
        if library_kernel:
            self.call("cuKernelSetAttribute", attr, nbytes, fn, self.device)
        else:
            self.call("cuFuncSetAttribute", fn, attr, nbytes)
        self._smem_opted.add(key)

    def _config(self, grid: Sequence[int], block: Sequence[int], smem: int):
        """A CUlaunchConfig of this geometry (no stream set), made once per thread."""
        config = self._cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = smem
        config.numAttrs = 0
        return config

    def launch(self, fn: int, grid: Sequence[int], block: Sequence[int], smem: int,
               stream: int, packer: struct.Struct, values: Sequence) -> None:  # fmt: skip
        """Enqueue `fn` on `stream` and return at once. `packer` lays out the kernel's
        parameters (C alignment, as the CUDA ABI does); `values` fill it in order.
        `grid` and `block` are 3-tuples."""
        tls = self._tls
        if not tls.ready:
            self.current()
        packer.pack_into(tls.params, 0, *values)
        tls.size[0] = packer.size
        key = (grid, block, smem)
        config = tls.configs.get(key)
        if config is None:
            config = tls.configs[key] = self._config(grid, block, smem)
        config.hStream = stream
        (status,) = self._cu.cuLaunchKernelEx(config, fn, None, tls.extra_address)
        if status:
            self.check(status, "cuLaunchKernelEx")

    def prepare(
        self,
        fn: int,
        grid: Sequence[int],
        block: Sequence[int],
        smem: int,
        packer: struct.Struct,
        values: Sequence,
        patches: tuple,
    ) -> PreparedLaunch:
        """`fn`'s launch with `values` packed once (`PreparedLaunch`); `patches` as
        PreparedLaunch.launch takes them, with parameter indices for offsets."""
        offsets = param_offsets(packer)
        return PreparedLaunch(self, fn, grid, block, smem, packer, values,
                              tuple((offsets[i], slot, at) for i, slot, at in patches))  # fmt: skip

    def launch_params(self, fn: int, grid: Sequence[int], block: Sequence[int], smem: int,
                      stream: int, params: Sequence[tuple[str, Any]]) -> None:  # fmt: skip
        """`launch` with the parameters as (struct code, value) pairs (`array_params`,
        `scalar_param`): for callers without Numba's types (the quick start). `fn` a
        CUfunction (`function`); grid and block of 1 to 3 dimensions; more than 48 KiB
        of dynamic shared memory is opted in to first."""
        fmt = "@" + "".join(code for code, _ in params)
        packer = _PACKERS.get(fmt)
        if packer is None:
            packer = _PACKERS[fmt] = struct.Struct(fmt)
        self.opt_in_smem(fn, smem)
        grid3 = tuple(int(n) for n in (*grid, 1, 1)[:3])
        block3 = tuple(int(n) for n in (*block, 1, 1)[:3])
        self.launch(fn, grid3, block3, smem, stream, packer, [value for _, value in params])


_PACKERS: dict[str, struct.Struct] = {}
_INT_CODES = {"int8": "b", "uint8": "B", "int16": "h", "uint16": "H", "int32": "i",
              "uint32": "I", "uint64": "Q"}  # fmt: skip


def array_params(ptr: int, shape: tuple, dtype) -> list[tuple[str, int]]:
    """The kernel parameters Numba passes for a C-contiguous array argument, as (struct
    code, value) pairs: meminfo and parent (null), the element count, the item size,
    the data pointer, then the shape and the strides in bytes, all 64-bit."""
    itemsize = np.dtype(dtype).itemsize
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= int(n)
    strides.reverse()
    values = [0, 0, step // itemsize, itemsize, int(ptr), *[int(n) for n in shape], *strides]
    return [("q", v) for v in values]


def scalar_param(value) -> tuple[str, Any]:
    """A scalar kernel parameter as (struct code, value), typed as Numba types it:
    Python int and np.int64 as int64, other NumPy integers as themselves, np.float32
    as float32, Python float as float64, bool as a one-byte boolean."""
    if isinstance(value, np.float32):
        return "f", float(value)
    if isinstance(value, float | np.float64):
        return "d", float(value)
    if isinstance(value, bool | np.bool_):
        return "?", bool(value)
    if isinstance(value, np.integer) and value.dtype != np.int64:
        return _INT_CODES[value.dtype.name], int(value)
    if isinstance(value, int | np.integer):
        return "q", int(value)
    raise TypeError(f"unsupported kernel parameter {value!r}")


def param_offsets(packer: struct.Struct) -> list[int]:
    """Byte offset of each parameter in `packer`'s layout (one struct code each)."""
    fmt = packer.format.lstrip("@")
    return [struct.calcsize("@" + fmt[: i + 1]) - struct.calcsize("@" + fmt[i])
            for i in range(len(fmt))]  # fmt: skip


class PreparedLaunch:
    """One kernel launch whose parameters are packed once: each `launch` writes only
    the pointer parameters that change (and the stream) into its own buffer and
    enqueues it. Thread-safe: a lock keeps one thread's pointers until the driver
    has copied them (cuLaunchKernelEx copies the parameter buffer before returning)."""

    __slots__ = ("_drv", "_params", "_words", "_config", "_size", "_extra", "_patches",
                 "_lock", "_stream", "_call", "_fn", "_extra_address")  # fmt: skip

    def __init__(
        self,
        drv: Driver,
        fn: int,
        grid: Sequence[int],
        block: Sequence[int],
        smem: int,
        packer: struct.Struct,
        values: Sequence,
        patches: tuple,
    ) -> None:
        self._drv = drv
        # Whole 64-bit words, so that a patched pointer is one item assignment.
        self._words = np.zeros(max(-(-packer.size // 8), 1), np.int64)
        self._params = self._words.view(np.uint8)
        packer.pack_into(self._params, 0, *values)
        if any(offset % 8 for offset, _, _ in patches):
            raise ValueError("pointer parameters are 8-byte aligned")
        self._patches = tuple((offset // 8, slot, at) for offset, slot, at in patches)
        self._size = np.array([packer.size], np.uint64)
        self._extra = _extra(self._params, self._size)
        self._extra_address = address(self._extra)
        self._config = drv._config(tuple(grid), tuple(block), smem)
        self._stream = None  # the stream in _config
        self._lock = threading.Lock()
        self._call = drv._cu.cuLaunchKernelEx
        self._fn = fn

    def launch(self, stream: int, bases: Sequence[int]) -> None:
        """Enqueue on `stream` with each patched pointer parameter set to
        bases[slot] + at, for the (byte offset, slot, at) patches it was made with.
        `bases`: a list or tuple of ints."""
        drv = self._drv
        if not drv._tls.ready:
            drv.current()
        words = self._words
        with self._lock:
            for index, slot, at in self._patches:
                words[index] = bases[slot] + at
            if stream != self._stream:
                self._config.hStream = stream
                self._stream = stream
            (status,) = self._call(self._config, self._fn, None, self._extra_address)
        if status:
            drv.check(status, "cuLaunchKernelEx")


def context_memory_message(cu, device) -> str:
    """What to tell a user whose GPU had no memory left to open a CUDA context: the
    free and total memory as nvidia-smi reports them (a context is needed to ask
    CUDA), when it answers within a few seconds."""
    text = "the GPU has too little free memory to open a CUDA context (a few hundred MiB)"
    status, bus = cu.cuDeviceGetPCIBusId(32, device)
    if status:
        return text
    query = ["nvidia-smi", "--query-gpu=memory.free,memory.total", "--format=csv,noheader,nounits",
             "-i", bus.split(b"\0", 1)[0].decode()]  # fmt: skip
    try:
        done = subprocess.run(query, capture_output=True, text=True, timeout=5, check=True)
        free, total = (int(v) for v in done.stdout.split(","))
    except (OSError, ValueError, subprocess.SubprocessError):
        return text
    return f"{text}: {free} MiB free of {total} MiB"


_driver: Driver | None = None
_driver_lock = threading.Lock()


def driver() -> Driver:
    """The process's Driver (opened on first use, thread-safe). Raises CudaError."""
    global _driver
    if _driver is None:
        with _driver_lock:
            if _driver is None:
                _driver = Driver()
    return _driver
