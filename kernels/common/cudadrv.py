"""The CUDA driver API through ctypes: the one launch and memory layer of the package.

Numba compiles the kernels; this module runs them. Everything a call needs per launch
(kernel launch, stream-ordered copies, allocation) is a direct driver call here, so a
call costs microseconds of Python, never waits for the device unless asked to, and
works on any stream a caller names. Numba-free: the quick start
(`imgfilter.backends.cached`) uses it without importing Numba.

Contexts: the primary context of device 0, made current in every thread that calls
in (`current`). Every driver failure raises `CudaError` carrying the CUDA error name;
out of memory raises `GpuOutOfMemory` (a `MemoryError`).
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Sequence
from typing import Any

_LIBS = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")
_ATTR_CC_MAJOR, _ATTR_CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*
_ATTR_MAX_DYNAMIC_SMEM = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
SMEM_DEFAULT = 48 * 1024  # dynamic shared memory a launch gets without opting in
_OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY

# cuLaunchKernel's `extra` markers: the parameters as one packed buffer.
_PARAM_END, _PARAM_BUFFER_POINTER, _PARAM_BUFFER_SIZE = 0, 1, 2
_PARAM_BYTES = 4096  # CUDA's limit on kernel parameters (older GPUs) fits


class CudaError(RuntimeError):
    """A CUDA driver call failed (or no driver is installed). `code` is the CUresult."""

    def __init__(self, message: str, code: int = -1) -> None:
        super().__init__(message)
        self.code = code


class GpuOutOfMemory(CudaError, MemoryError):
    """The GPU could not give the memory a call needs."""


class NoMemoryForContext(GpuOutOfMemory):
    """The GPU had not even the memory to open a CUDA context."""


_c = ctypes
_u64, _uint, _vp, _sz = _c.c_uint64, _c.c_uint, _c.c_void_p, _c.c_size_t


class _LaunchConfig(_c.Structure):
    """CUlaunchConfig: grid, block, dynamic shared memory, stream, no attributes."""

    _fields_ = [
        ("gridDimX", _uint), ("gridDimY", _uint), ("gridDimZ", _uint),
        ("blockDimX", _uint), ("blockDimY", _uint), ("blockDimZ", _uint),
        ("sharedMemBytes", _uint), ("hStream", _vp), ("attrs", _vp), ("numAttrs", _uint),
    ]  # fmt: skip


def _signatures(lib) -> None:
    """Argument types for the hot calls: ctypes then converts ints without wrappers."""
    lib.cuLaunchKernelEx.argtypes = [_vp, _vp, _vp, _vp]
    lib.cuMemcpyHtoDAsync_v2.argtypes = [_u64, _vp, _sz, _vp]
    lib.cuMemcpyDtoHAsync_v2.argtypes = [_vp, _u64, _sz, _vp]
    lib.cuMemcpyDtoDAsync_v2.argtypes = [_u64, _u64, _sz, _vp]
    lib.cuMemsetD8Async.argtypes = [_u64, _c.c_ubyte, _sz, _vp]
    lib.cuMemAlloc_v2.argtypes = [_c.POINTER(_u64), _sz]
    lib.cuMemFree_v2.argtypes = [_u64]
    lib.cuStreamSynchronize.argtypes = [_vp]
    lib.cuCtxSetCurrent.argtypes = [_vp]


class _ThreadState(threading.local):
    """A thread's launch state (`Driver.current`). `ready` has a class default because
    reading an unset attribute of a threading.local raises and catches AttributeError
    (a third of a microsecond, on every launch)."""

    ready = False


def driver_library() -> ctypes.CDLL | None:
    """The NVIDIA driver's library (libcuda), loaded, or None where there is none."""
    for name in _LIBS:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


class Driver:
    """Device 0's primary context and the calls the package makes. Thread-safe: the
    context is made current in each calling thread before its first call."""

    def __init__(self) -> None:
        lib = driver_library()
        if lib is None:
            raise CudaError(
                "no NVIDIA driver found (libcuda): GPU work (device arrays, kernels.softmax, "
                "kernels.linalg.gemv, the cuda backend) needs an NVIDIA GPU and its driver"
            )
        self._lib = lib
        _signatures(lib)
        status = lib.cuInit(_uint(0))
        if status:
            raise CudaError(f"no usable NVIDIA GPU (cuInit: {self.error_name(status)})", status)
        dev = _c.c_int()
        self.call("cuDeviceGet", _c.byref(dev), _c.c_int(0))
        self.device = dev
        major, minor = _c.c_int(), _c.c_int()
        self.call("cuDeviceGetAttribute", _c.byref(major), _ATTR_CC_MAJOR, dev)
        self.call("cuDeviceGetAttribute", _c.byref(minor), _ATTR_CC_MINOR, dev)
        self.cc = (major.value, minor.value)
        self.context = _vp()
        status = lib.cuDevicePrimaryCtxRetain(_c.byref(self.context), dev)
        if status == _OOM:
            raise NoMemoryForContext(context_memory_message(lib, dev), status)
        self.check(status, "cuDevicePrimaryCtxRetain")
        self._tls = _ThreadState()
        self._smem_opted: set = set()
        self.current()

    # ------------------------------------------------------------------ basics
    def attribute(self, code: int) -> int:
        """cuDeviceGetAttribute of the device (a CUdevice_attribute code)."""
        value = _c.c_int()
        self.call("cuDeviceGetAttribute", _c.byref(value), _c.c_int(code), self.device)
        return value.value

    def name(self) -> str:
        """The device's name, as cuDeviceGetName gives it (e.g. "NVIDIA H100 80GB HBM3")."""
        buf = _c.create_string_buffer(256)
        self.call("cuDeviceGetName", buf, _c.c_int(len(buf)), self.device)
        return buf.value.decode(errors="replace")

    def error_name(self, status: int) -> str:
        text = _c.c_char_p()
        self._lib.cuGetErrorName(status, _c.byref(text))
        return text.value.decode() if text.value else str(status)

    def check(self, status: int, name: str) -> None:
        if status != 0:
            label = self.error_name(status)
            cls = GpuOutOfMemory if status == _OOM else CudaError
            raise cls(f"{name} failed: {label}", status)

    def call(self, name: str, *args) -> None:
        self.check(getattr(self._lib, name)(*args), name)

    def current(self) -> None:
        """Make the context current in the calling thread (once per thread)."""
        tls = self._tls
        if tls.ready:
            return
        self._lib.cuCtxSetCurrent(self.context)
        tls.ready = True
        tls.params = _c.create_string_buffer(_PARAM_BYTES)
        tls.size = _sz(0)
        tls.extra = (_vp * 5)(
            _PARAM_BUFFER_POINTER, _c.addressof(tls.params),
            _PARAM_BUFFER_SIZE, _c.addressof(tls.size), _PARAM_END,
        )  # fmt: skip
        tls.extra_address = _c.addressof(tls.extra)
        tls.configs, tls.addresses = {}, {}

    def free_and_total(self) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        self.current()
        free, total = _sz(), _sz()
        self.call("cuMemGetInfo_v2", _c.byref(free), _c.byref(total))
        return free.value, total.value

    # ------------------------------------------------------------------ memory
    def alloc(self, nbytes: int) -> int:
        """cuMemAlloc: no wait for the device. Raises GpuOutOfMemory."""
        self.current()
        ptr = _u64()
        self.check(self._lib.cuMemAlloc_v2(_c.byref(ptr), max(nbytes, 1)), "cuMemAlloc")
        return ptr.value

    def free(self, ptr: int) -> None:
        """cuMemFree: waits for the device; only the pool's trim calls it."""
        self.current()
        self.check(self._lib.cuMemFree_v2(ptr), "cuMemFree")

    def upload(self, ptr: int, host_address: int, nbytes: int, stream: int) -> None:
        """Copy host bytes to the device in `stream`'s order. From pageable memory the
        driver stages the bytes before returning (the host buffer may then change) and
        does not wait for the device."""
        self.current()
        self.check(self._lib.cuMemcpyHtoDAsync_v2(ptr, host_address, nbytes, stream), "upload")

    def download(self, host_address: int, ptr: int, nbytes: int, stream: int) -> None:
        """Copy device bytes to the host in `stream`'s order, then wait for the stream
        (the bytes are in place on return)."""
        self.current()
        self.check(self._lib.cuMemcpyDtoHAsync_v2(host_address, ptr, nbytes, stream), "download")
        self.synchronize(stream)

    def download_async(self, host_address: int, ptr: int, nbytes: int, stream: int) -> None:
        """Copy device bytes to pinned host memory in `stream`'s order, without waiting:
        the bytes are in place once the stream has reached the copy."""
        self.current()
        self.check(self._lib.cuMemcpyDtoHAsync_v2(host_address, ptr, nbytes, stream), "download")

    def host_alloc(self, nbytes: int) -> int:
        """Page-locked host memory (cuMemHostAlloc, portable): what copies overlap with
        kernels from. Raises GpuOutOfMemory when it cannot be had."""
        self.current()
        address = _vp()
        self.call("cuMemHostAlloc", _c.byref(address), _sz(max(nbytes, 1)), _uint(1))
        return address.value

    def host_free(self, address: int) -> None:
        self.current()
        self.call("cuMemFreeHost", _vp(address))

    def stream_create(self) -> int:
        """A new stream that does not synchronise with the legacy default stream."""
        self.current()
        handle = _vp()
        self.call("cuStreamCreate", _c.byref(handle), _uint(1))  # CU_STREAM_NON_BLOCKING
        return handle.value

    def stream_destroy(self, handle: int) -> None:
        self.current()
        self.call("cuStreamDestroy_v2", _vp(handle))

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.current()
        self.check(self._lib.cuMemcpyDtoDAsync_v2(dst, src, nbytes, stream), "copy")

    def memset(self, ptr: int, byte: int, nbytes: int, stream: int) -> None:
        self.current()
        self.check(self._lib.cuMemsetD8Async(ptr, byte, nbytes, stream), "memset")

    def idle(self, stream: int) -> bool:
        """Whether every piece of work queued on `stream` has finished (no waiting)."""
        self.current()
        status = self._lib.cuStreamQuery(_vp(stream))
        if status == 600:  # CUDA_ERROR_NOT_READY
            return False
        self.check(status, "cuStreamQuery")
        return True

    def capturing(self, stream: int) -> bool:
        """Whether `stream` is being captured into a CUDA graph (cuStreamIsCapturing)."""
        self.current()
        status = _c.c_int(0)
        self.call("cuStreamIsCapturing", _vp(stream), _c.byref(status))
        return status.value != 0  # CU_STREAM_CAPTURE_STATUS_NONE is 0

    def synchronize(self, stream: int) -> None:
        self.current()
        self.check(self._lib.cuStreamSynchronize(stream), "cuStreamSynchronize")

    # ------------------------------------------------------------------ kernels
    def function(self, cubin: bytes, entry: str) -> int:
        """Load a cubin image and return its kernel `entry` as a CUfunction address.
        The module stays loaded for the life of the process."""
        self.current()
        module = _vp()
        self.call("cuModuleLoadData", _c.byref(module), _c.c_char_p(cubin))
        fn = _vp()
        self.call("cuModuleGetFunction", _c.byref(fn), module, entry.encode())
        return fn.value

    def opt_in_smem(self, fn: int, nbytes: int, library_kernel: bool = False) -> None:
        """Let `fn` take more than 48 KiB of dynamic shared memory; once per function
        and size. `library_kernel`: fn is a CUkernel (what Numba loads), not a
        CUfunction from `function`."""
        key = (fn, nbytes)
        if nbytes <= SMEM_DEFAULT or key in self._smem_opted:
            return
        self.current()
        value = _c.c_int(nbytes)
        if library_kernel:
            self.call("cuKernelSetAttribute", _ATTR_MAX_DYNAMIC_SMEM, value, _vp(fn), self.device)
        else:
            self.call("cuFuncSetAttribute", _vp(fn), _ATTR_MAX_DYNAMIC_SMEM, value)
        self._smem_opted.add(key)

    def launch(self, fn: int, grid: Sequence[int], block: Sequence[int], smem: int,
               stream: int, packer: struct.Struct, values: Sequence) -> None:  # fmt: skip
        """Enqueue `fn` on `stream` and return at once. `packer` lays out the kernel's
        parameters (C alignment, as the CUDA ABI does); `values` fill it in order.
        `grid` and `block` are 3-tuples."""
        tls = self._tls
        if not tls.ready:
            self.current()
        packer.pack_into(tls.params, 0, *values)
        tls.size.value = packer.size
        # cuLaunchKernelEx with a launch configuration kept per thread and geometry:
        # four arguments cross ctypes instead of eleven (about 2 us less per launch).
        key = (grid, block, smem)
        config = tls.configs.get(key)
        if config is None:
            config = tls.configs[key] = _LaunchConfig(*grid, *block, smem, None, None, 0)
            tls.addresses[key] = _c.addressof(config)
        config.hStream = stream
        status = self._lib.cuLaunchKernelEx(tls.addresses[key], fn, None, tls.extra_address)
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
    import numpy as np

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
    import numpy as np

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
                 "_lock", "_stream", "_call", "_args")  # fmt: skip

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
        self._params = _c.create_string_buffer(max(-(-packer.size // 8) * 8, 8))
        packer.pack_into(self._params, 0, *values)
        self._words = (_c.c_int64 * (len(self._params) // 8)).from_buffer(self._params)
        if any(offset % 8 for offset, _, _ in patches):
            raise ValueError("pointer parameters are 8-byte aligned")
        self._patches = tuple((offset // 8, slot, at) for offset, slot, at in patches)
        self._size = _sz(packer.size)
        self._extra = (_vp * 5)(
            _PARAM_BUFFER_POINTER, _c.addressof(self._params),
            _PARAM_BUFFER_SIZE, _c.addressof(self._size), _PARAM_END,
        )  # fmt: skip
        self._config = _LaunchConfig(*grid, *block, smem, None, None, 0)
        self._stream = None  # the stream in _config
        self._lock = threading.Lock()
        self._call = drv._lib.cuLaunchKernelEx
        self._args = (_c.addressof(self._config), fn, None, _c.addressof(self._extra))

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
            status = self._call(*self._args)
        if status:
            drv.check(status, "cuLaunchKernelEx")


class _NvmlMemory(_c.Structure):
    _fields_ = [("total", _c.c_ulonglong), ("free", _c.c_ulonglong), ("used", _c.c_ulonglong)]


def context_memory_message(lib, dev) -> str:
    """What to tell a user whose GPU had no memory left to open a CUDA context: the
    free and total memory as NVML reports them (a context is needed to ask CUDA),
    when NVML answers."""
    text = "the GPU has too little free memory to open a CUDA context (a few hundred MiB)"
    try:
        bus = _c.create_string_buffer(32)
        if lib.cuDeviceGetPCIBusId(bus, 32, dev) != 0:
            return text
        nvml = _c.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return text
        try:
            handle, mem = _vp(), _NvmlMemory()
            if nvml.nvmlDeviceGetHandleByPciBusId_v2(bus, _c.byref(handle)) != 0:
                return text
            if nvml.nvmlDeviceGetMemoryInfo(handle, _c.byref(mem)) != 0:
                return text
        finally:
            nvml.nvmlShutdown()
    except (OSError, AttributeError):  # no NVML library, or an old one
        return text
    return f"{text}: {mem.free / 2**20:.0f} MiB free of {mem.total / 2**20:.0f} MiB"


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
