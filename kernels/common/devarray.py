"""Device arrays, their memory pool, and the streams calls run on (Numba-free).

`DeviceArray` is a strided view of device memory: what the kernels' launch functions
take and what the GPU entry points return for device inputs. It exports
`__cuda_array_interface__` (v3, with the stream it was written on), so
`cupy.asarray(a)`, `torch.as_tensor(a, device="cuda")` and Numba kernels take it
without a copy; `copy_to_host()` brings it back.

Memory comes from a caching pool, as PyTorch's allocator does it: a block freed by its
last array goes back to the free list of the stream it was allocated on and is reused
only by later allocations on that stream, which the stream orders after every use
already queued there. So the steady state makes no cuMemAlloc and no cuMemFree (which
waits for the device), and nothing waits for the GPU. An array used on another stream
than its own must be kept alive until that work is done (torch's `record_stream` rule).
When the device is full, the pool waits for the device, returns its cached blocks and
tries again once.

Streams (`resolve_stream`): a caller's `stream=` (a CuPy, PyTorch, Numba or cuda.core
stream, an object with `__cuda_stream__`, or a raw CUstream handle as an int); else
the `stream` entry of the first input's `__cuda_array_interface__`; else CUDA's
legacy default stream (handle 0), which orders with every blocking stream.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
from typing import Any

import numpy as np

from .cudadrv import GpuOutOfMemory, address, driver

LEGACY = 0  # CUstream handle of the legacy default stream (CU_STREAM_LEGACY is 1, the same)
PER_THREAD = 2  # CU_STREAM_PER_THREAD


class _Block:
    """A pooled allocation; returns itself to its free list (that of its stream and
    size) when collected. `stream` is the pool's key for the stream: its handle, or
    (PER_THREAD, thread id) for the per-thread default stream, which is a different
    stream in each thread."""

    __slots__ = ("ptr", "size", "stream", "_free", "__weakref__")

    def __init__(self, ptr: int, size: int, stream, free: list) -> None:
        self.ptr, self.size, self.stream, self._free = ptr, size, stream, free

    def __del__(self) -> None:
        self._free.append(self.ptr)  # atomic: no lock needed


def release_other_pools() -> bool:
    """Ask the caching allocators of CuPy and PyTorch, where this process has already
    imported them, to give their unused device blocks back to CUDA (what their users
    would do by hand: `cupy.get_default_memory_pool().free_all_blocks()`,
    `torch.cuda.empty_cache()`); blocks in use by their arrays stay. Neither library
    is imported here. Returns whether one was asked.

    Their cached blocks hold device memory that this pool cannot use: a CuPy array's
    scratch (cupy.random makes 4 bytes a value first) can leave tens of GB cached.
    """
    asked = False
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        with contextlib.suppress(Exception):  # a CuPy without a usable device
            cupy.get_default_memory_pool().free_all_blocks()
            asked = True
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()
                asked = True
    return asked


# Device bytes the pool may hold (in use and cached) before a new allocation first
# gives its cached blocks back to CUDA: IMGFILTER_GPU_POOL_BYTES, else this.
DEFAULT_POOL_LIMIT = 4 << 30


def _limit_from_env() -> int:
    text = os.environ.get("IMGFILTER_GPU_POOL_BYTES", "")
    try:
        return max(0, int(text)) if text else DEFAULT_POOL_LIMIT
    except ValueError:
        return DEFAULT_POOL_LIMIT


class Pool:
    """Stream-keyed caching allocator (see the module docstring). Thread-safe: a
    free list is only appended to and popped from (atomic operations), and the
    lists stay in the pool for good, so taking and returning a cached block needs
    no lock; the lock guards new lists and the trim.

    Bounded: when a block must be allocated while the pool holds more than `limit`
    bytes (`allocated_bytes`: cached and in use), its cached blocks go back to CUDA
    first (`trim`, which waits for the device once). So the memory held stays within
    the limit plus what arrays in use hold, whatever sizes the calls take; calls that
    repeat their sizes reuse cached blocks and never reach the trim."""

    def __init__(self) -> None:
        self._free: dict[tuple, list[int]] = {}
        self._lock = threading.Lock()
        self.allocated_bytes = 0  # cuMemAlloc'd by the pool, cached or in use
        self.limit = _limit_from_env()

    @property
    def cached_bytes(self) -> int:
        """Bytes in free lists: allocated by the pool, in use by no array."""
        return sum(size * len(ptrs) for (_, size), ptrs in list(self._free.items()))

    def allocate(self, nbytes: int, stream: int) -> _Block:
        # Block sizes: 512-byte steps up to 1 MiB, then 2 MiB steps (few distinct
        # sizes, little waste for images).
        if nbytes < (1 << 20):
            size = ((nbytes + 511) >> 9) << 9 or 512
        else:
            size = -(-nbytes // (2 << 20)) * (2 << 20)
        if stream <= PER_THREAD:  # the special handles 0, 1 and 2
            if stream == 1:
                stream = LEGACY
            elif stream == PER_THREAD:  # one handle, but each thread's own stream
                stream = (PER_THREAD, threading.get_ident())
        free = self._free.get((stream, size))
        if free is None:
            with self._lock:
                free = self._free.setdefault((stream, size), [])
        try:
            ptr = free.pop()
        except IndexError:
            ptr = 0  # device allocations are never at 0
        return _Block(ptr or self._new(size, stream), size, stream, free)

    def _new(self, size: int, stream) -> int:
        """A fresh cuMemAlloc of `size` bytes, after a trim when the pool holds more
        than its limit (not while `stream` is being captured into a CUDA graph, where
        waiting for the device is not allowed); when the device is full, the cache is
        trimmed and the allocation tried once more, and then once more after the
        other memory pools of this process give back their unused blocks
        (`release_other_pools`)."""
        drv = driver()
        if self.allocated_bytes + size > self.limit and self.cached_bytes:
            handle = stream[0] if isinstance(stream, tuple) else stream
            if not drv.capturing(handle):
                self.trim()
        try:
            ptr = drv.alloc(size)
        except GpuOutOfMemory:
            self.trim()
            try:
                try:
                    ptr = drv.alloc(size)
                except GpuOutOfMemory:
                    if not release_other_pools():
                        raise
                    ptr = drv.alloc(size)
            except GpuOutOfMemory as exc:
                free_now, total = drv.free_and_total()
                raise GpuOutOfMemory(
                    f"the GPU is out of memory: {size / 2**20:.1f} MiB needed, "
                    f"{free_now / 2**20:.1f} MiB free of {total / 2**20:.0f} MiB",
                    exc.code,
                ) from None
        with self._lock:
            self.allocated_bytes += size
        return ptr

    def trim(self) -> None:
        """Wait for the device, then give every cached block back to CUDA."""
        drv = driver()
        blocks = []
        with self._lock:
            for (_, size), ptrs in self._free.items():
                while True:
                    try:
                        blocks.append((ptrs.pop(), size))
                    except IndexError:
                        break
            self.allocated_bytes -= sum(size for _, size in blocks)
        drv.current()
        drv.call("cuCtxSynchronize")
        for ptr, _ in blocks:
            drv.free(ptr)


POOL = Pool()


def set_pool_limit(nbytes: int) -> None:
    """Set the device bytes the pool may hold before it gives cached blocks back to
    CUDA (`Pool`; default DEFAULT_POOL_LIMIT or IMGFILTER_GPU_POOL_BYTES). 0 keeps
    nothing cached beyond the arrays in use on a new allocation."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"the pool limit must be a number of bytes >= 0, got {nbytes!r}")
    POOL.limit = nbytes


class _Recorder(threading.local):
    """`active`: the calling thread's launch recording, if any
    (kernels.common.launch.Recording). A class default, because reading an unset
    attribute of a threading.local raises and catches AttributeError, which costs a
    third of a microsecond per call."""

    active = None


_recorder = _Recorder()


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


class DeviceArray:
    """A strided view of device memory (see the module docstring).

    shape, strides (bytes), dtype, size, nbytes and ndim as NumPy's; `ptr` the
    address of element 0; `stream` the CUstream handle the data was written on.
    """

    __slots__ = ("ptr", "shape", "strides", "dtype", "size", "stream", "_owner", "_sig",
                 "__weakref__")  # fmt: skip

    def __init__(self, ptr: int, shape: tuple, dtype, strides: tuple | None = None,
                 stream: int = LEGACY, owner: Any = None) -> None:  # fmt: skip
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        c_strides = _c_strides(shape, dtype.itemsize)
        strides = c_strides if strides is None else tuple(int(s) for s in strides)
        size = 1
        for n in shape:
            size *= n
        self.ptr, self.shape, self.strides, self.dtype = int(ptr), shape, strides, dtype
        self.size, self.stream, self._owner = size, stream, owner
        layout = "C" if _contiguous(shape, strides, c_strides) else "A"
        self._sig = (dtype.num, len(shape), layout)  # its Numba type (kernels.common.launch)

    def params(self) -> tuple:
        """The kernel parameters Numba passes for this array: meminfo, parent, size,
        itemsize, data, shape, strides."""
        return (0, 0, self.size, self.dtype.itemsize, self.ptr, *self.shape, *self.strides)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_c_contiguous(self) -> bool:
        return self._sig[2] == "C"

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, ptr={self.ptr:#x})"

    @property
    def __cuda_array_interface__(self) -> dict:
        contiguous = self.is_c_contiguous
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "strides": None if contiguous else self.strides,
            "version": 3,
            "stream": 1 if self.stream == LEGACY else self.stream,
        }

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple | None = None,
                   dl_device: tuple | None = None, copy: bool | None = None) -> Any:  # fmt: skip
        """A DLPack capsule of this array (`torch.from_dlpack`, `jax.dlpack.from_dlpack`,
        `cupy.from_dlpack`, `np.from_dlpack` refuses device memory), made by
        cuda.core's StridedMemoryView (cuda-core >= 1.2). `stream`: the consumer's; its
        work is then ordered after this array's stream."""
        StridedMemoryView = _strided_memory_view()  # noqa: N806 - a class
        if not hasattr(StridedMemoryView, "__dlpack__"):
            raise BufferError("exporting through DLPack needs cuda-core >= 1.2; "
                              "use __cuda_array_interface__ instead")  # fmt: skip
        view = StridedMemoryView.from_cuda_array_interface(self, stream_ptr=-1)
        if stream not in (None, -1) and stream != self.stream:
            _order_after(self.stream, LEGACY if stream in (1, 2) else stream)
        return view.__dlpack__(max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)  # kDLCUDA, device 0 (the package runs on device 0)

    def reshape(self, *shape) -> DeviceArray:
        """A view with another shape (C-contiguous arrays only; one -1 allowed)."""
        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        shape = tuple(int(n) for n in shape)
        if -1 in shape:
            known = 1
            for n in shape:
                known *= n if n != -1 else 1
            shape = tuple(self.size // known if n == -1 else n for n in shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} into {shape}")
        if not self.is_c_contiguous:
            raise ValueError("only C-contiguous device arrays can be reshaped")
        return c_array(self.ptr, shape, self.dtype, self.stream, self._base())

    def view(self, dtype) -> DeviceArray:
        """The same bytes as another dtype (C-contiguous; the last axis is rescaled)."""
        dtype = np.dtype(dtype)
        if not self.is_c_contiguous or (self.shape[-1] * self.dtype.itemsize) % dtype.itemsize:
            raise ValueError(f"cannot view {self.shape} {self.dtype} as {dtype}")
        last = self.shape[-1] * self.dtype.itemsize // dtype.itemsize
        shape = (*self.shape[:-1], last)
        return c_array(self.ptr, shape, dtype, self.stream, self._base())

    def __getitem__(self, key) -> DeviceArray:
        """a[i] (one element of the first axis) or a[start:stop] (basic slicing with
        step 1 along the first axis): views, what the kernels and batches need."""
        if isinstance(key, tuple) and len(key) == 1:
            key = key[0]
        if isinstance(key, int | np.integer):
            i = int(key) + (self.shape[0] if key < 0 else 0)
            if not 0 <= i < self.shape[0]:
                raise IndexError(f"index {key} is out of bounds for axis 0 of {self.shape}")
            ptr = self.ptr + i * self.strides[0]
            return DeviceArray(ptr, self.shape[1:], self.dtype, self.strides[1:], self.stream,
                               self._base())  # fmt: skip
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("DeviceArray supports a[i] and a[start:stop] only")
        start, stop, _ = key.indices(self.shape[0])
        stop = max(stop, start)
        shape = (stop - start, *self.shape[1:])
        ptr = self.ptr + start * self.strides[0]
        return DeviceArray(ptr, shape, self.dtype, self.strides, self.stream, self._base())

    def _base(self):
        return self._owner if self._owner is not None else self

    def copy_to_host(self, ary: np.ndarray | None = None, stream: Any = None) -> np.ndarray:
        """The array as a NumPy array (waits for the stream it was written on)."""
        if not self.is_c_contiguous:
            raise ValueError("copy_to_host needs a C-contiguous device array")
        host = np.empty(self.shape, self.dtype) if ary is None else ary
        if host.nbytes != self.nbytes or not host.flags.c_contiguous:
            raise ValueError("the host array must be C-contiguous with as many bytes")
        handle = self.stream if stream is None else resolve_stream(stream)
        driver().download(address(host), self.ptr, self.nbytes, handle)
        return host

    def get(self) -> np.ndarray:
        """CuPy's name for copy_to_host."""
        return self.copy_to_host()


def c_array(ptr: int, shape: tuple, dtype: np.dtype, stream: int, owner: Any) -> DeviceArray:
    """A C-contiguous DeviceArray, built without DeviceArray's checks: ptr an int,
    shape a tuple of ints, dtype a numpy dtype (the internal fast path)."""
    a = object.__new__(DeviceArray)
    itemsize = dtype.itemsize
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    strides.reverse()
    a.ptr, a.shape, a.strides, a.dtype = ptr, shape, tuple(strides), dtype
    a.size, a.stream, a._owner = step // itemsize, stream, owner
    a._sig = (dtype.num, len(shape), "C")
    return a


def _contiguous(shape: tuple, strides: tuple, c_strides: tuple) -> bool:
    return all(n == 1 or s == c for n, s, c in zip(shape, strides, c_strides, strict=True))


def empty(shape: tuple, dtype, stream: int = LEGACY) -> DeviceArray:
    """An uninitialised C-contiguous array from the pool, ordered on `stream`."""
    if type(dtype) is not np.dtype:
        dtype = np.dtype(dtype)
    shape = tuple([int(n) for n in shape])
    block = POOL.allocate(math.prod(shape) * dtype.itemsize, stream)
    recording = _recorder.active
    if recording is not None:
        recording.allocated(block)
    return c_array(block.ptr, shape, dtype, stream, block)


def empty_like(arr: DeviceArray, stream: int = LEGACY) -> DeviceArray:
    """An uninitialised C-contiguous array of a C-contiguous `arr`'s shape and dtype,
    from the pool on `stream` (`empty` without recomputing the layout)."""
    block = POOL.allocate(arr.nbytes, stream)
    recording = _recorder.active
    if recording is not None:
        recording.allocated(block)
    a = object.__new__(DeviceArray)
    a.ptr, a.shape, a.strides, a.dtype = block.ptr, arr.shape, arr.strides, arr.dtype
    a.size, a.stream, a._owner, a._sig = arr.size, stream, block, arr._sig
    return a


def to_device(host: np.ndarray, stream: int = LEGACY) -> DeviceArray:
    """A device copy of a host array, queued on `stream` (the host array may change
    once this returns: the driver has staged it)."""
    host = np.ascontiguousarray(host)
    recording = _recorder.active
    if recording is not None:
        recording.replayable = False  # the data would not be there on a replay
    arr = empty(host.shape, host.dtype, stream)
    if host.nbytes:
        driver().upload(arr.ptr, address(host), host.nbytes, stream)
    return arr


# ------------------------------------------------------------------ foreign arrays


_TORCH_DTYPES: dict = {}


def _torch_dtype(tdtype) -> np.dtype:
    dtype = _TORCH_DTYPES.get(tdtype)
    if dtype is None:
        dtype = _TORCH_DTYPES[tdtype] = np.dtype(str(tdtype).removeprefix("torch."))
    return dtype


def _torch_view(t) -> DeviceArray:
    """A torch CUDA tensor, read without building its interface dict (which costs
    several microseconds in torch's Python); its stream is torch's current stream
    on its device, as the interface would say."""

    dtype = _torch_dtype(t.dtype)
    itemsize = dtype.itemsize
    strides = tuple(s * itemsize for s in t.stride())
    stream = _torch_stream(t.get_device())
    return DeviceArray(t.data_ptr(), tuple(t.shape), dtype, strides, stream, t)


def _torch_stream(device: int) -> int:
    """torch's current stream on `device`, as a CUstream handle (legacy as 0)."""
    import torch

    try:
        stream = torch._C._cuda_getCurrentRawStream(device)
    except AttributeError:  # a torch without the private call
        stream = torch.cuda.current_stream(device).cuda_stream
    return LEGACY if stream in (0, 1) else stream


_CUPY: list = []  # cupy.cuda.get_current_stream, once imported


def _cupy_view(a) -> DeviceArray:
    """A CuPy array, read from its attributes (its interface dict costs more); its
    stream is CuPy's current stream, as the interface would say."""
    stream = _cupy_stream()
    contiguous = getattr(a, "_c_contiguous", None)
    if contiguous is None:
        contiguous = a.flags.c_contiguous
    if contiguous:
        return c_array(a.data.ptr, a.shape, a.dtype, stream, a)
    return DeviceArray(a.data.ptr, a.shape, a.dtype, a.strides, stream, a)


def cheap_view(obj: Any) -> DeviceArray | None:
    """A DeviceArray view of `obj` where one costs little (ours, CuPy, torch CUDA
    tensors), else None: for entry points' fast paths, which leave other inputs to
    their general path."""
    kind = type(obj)
    if kind is DeviceArray:
        return obj
    module = kind.__module__
    if module == "cupy" or module.startswith("cupy._core"):
        return _cupy_view(obj)
    if module == "torch" and getattr(obj, "is_cuda", False):
        return _torch_view(obj)
    return None


def peek(obj: Any, with_stream: bool = True) -> tuple | None:
    """(layout, data pointer, stream) of a DeviceArray, CuPy array or torch CUDA tensor,
    read from its attributes without building a view; None for anything else. For
    the entry points' replay tables (keys of repeated calls): `layout` is hashable
    and two arrays of one type have equal layouts exactly when their `cheap_view`s
    have the same shape, strides and dtype; `stream` is the array's own, as
    `cheap_view` reads it, or None without `with_stream` (a call given `stream=`
    need not ask CuPy or torch for their current stream)."""
    kind = type(obj)
    reader = _PEEKERS.get(kind)
    if reader is None:
        reader = _PEEKERS[kind] = _peeker(kind)
    return reader(obj, with_stream)


def _peek_ours(a: DeviceArray, with_stream: bool) -> tuple:
    return (a.shape, a.strides, a.dtype), a.ptr, a.stream


def _cupy_stream() -> int:
    """CuPy's current stream, as a CUstream handle (legacy as 0)."""
    if not _CUPY:
        from cupy.cuda import get_current_stream

        _CUPY.append(get_current_stream)
    stream = _CUPY[0]().ptr
    return LEGACY if stream in (0, 1) else stream


def _peek_cupy(a, with_stream: bool) -> tuple:
    return (a.shape, a.strides, a.dtype), a.data.ptr, _cupy_stream() if with_stream else None


def _peek_torch(t, with_stream: bool) -> tuple | None:
    device = t.get_device()
    if device < 0:
        return None
    stream = _torch_stream(device) if with_stream else None
    return (t.shape, t.stride(), t.dtype, device), t.data_ptr(), stream


def _peek_none(obj: Any, with_stream: bool) -> None:
    return None


def _peeker(kind: type):
    """`peek`'s reader for arrays of type `kind`."""
    if kind is DeviceArray:
        return _peek_ours
    module = kind.__module__
    if module == "cupy" or module.startswith("cupy._core"):
        return _peek_cupy
    if module == "torch" and kind.__name__ == "Tensor":
        return _peek_torch
    return _peek_none


_PEEKERS: dict = {}  # array type -> its `peek` reader


def _order_after(producer: int, consumer: int) -> None:
    """Make `consumer`'s later work wait for what `producer` has queued (an event)."""
    drv = driver()
    drv.current()
    event = drv.call("cuEventCreate", 2)  # CU_EVENT_DISABLE_TIMING
    drv.call("cuEventRecord", event, producer)
    drv.call("cuStreamWaitEvent", consumer, event, 0)
    drv.call("cuEventDestroy", event)


def native_empty(img: Any, shape: tuple, dtype) -> Any | None:
    """An uninitialised C-contiguous array of `shape` and `dtype` made by the library
    `img` comes from, on img's device: `torch.empty` for a torch CUDA tensor (torch's
    caching allocator, on torch's current stream), `cupy.empty` for a CuPy array
    (CuPy's pool); None for other arrays (ours, Numba's, DLPack producers)."""
    module = type(img).__module__
    if module == "torch":
        return sys.modules["torch"].empty(shape, dtype=img.dtype, device=img.device)
    if module == "cupy" or module.startswith("cupy._core"):
        cupy = sys.modules["cupy"]
        with img.device:
            return cupy.empty(shape, dtype)
    return None


def is_dlpack_device_array(obj: Any) -> bool:
    """Whether `obj` exports CUDA device memory through DLPack (JAX, TensorFlow, ...)."""
    device = getattr(obj, "__dlpack_device__", None)
    try:
        return device is not None and device()[0] in (2, 13)  # kDLCUDA, kDLCUDAManaged
    except (TypeError, ValueError, AttributeError, RuntimeError):
        return False


def _strided_memory_view() -> type:
    """cuda.core's StridedMemoryView (cuda.core.utils; cuda.core.experimental.utils
    before cuda-core 0.4)."""
    try:
        from cuda.core.utils import StridedMemoryView
    except ImportError:
        from cuda.core.experimental.utils import StridedMemoryView
    return StridedMemoryView


def _dlpack_view(obj: Any) -> DeviceArray:
    """A DeviceArray view of a DLPack producer's CUDA array (cuda.core's
    StridedMemoryView reads it). The producer orders its pending work before CUDA's
    legacy default stream, the view's stream."""
    StridedMemoryView = _strided_memory_view()  # noqa: N806 - a class
    make = getattr(StridedMemoryView, "from_dlpack", StridedMemoryView)  # cuda-core < 0.4: no
    view = make(obj, stream_ptr=1)  # 1: DLPack's name of the legacy stream
    itemsize = np.dtype(view.dtype).itemsize
    strides = None if view.strides is None else tuple(s * itemsize for s in view.strides)
    return DeviceArray(view.ptr, view.shape, view.dtype, strides, LEGACY, (obj, view))


def as_device_array(obj: Any) -> DeviceArray:
    """A DeviceArray view of a GPU array (ours, torch, anything with
    `__cuda_array_interface__`: CuPy, Numba; or a DLPack producer of CUDA memory),
    without copying or waiting."""
    view = cheap_view(obj)
    if view is not None:
        return view
    if not hasattr(obj, "__cuda_array_interface__") and is_dlpack_device_array(obj):
        return _dlpack_view(obj)
    cai = obj.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"])
    if cai.get("mask") is not None:
        raise ValueError("masked device arrays are not supported")
    ptr = cai["data"][0] or 0
    stream = cai.get("stream")
    stream = LEGACY if stream in (None, 1) else int(stream)
    return DeviceArray(ptr, cai["shape"], dtype, cai.get("strides"), stream, obj)


def _stream_getter(stream: Any):
    """How to read the CUstream handle of stream objects of `stream`'s type (None: it
    is not a stream)."""
    if isinstance(stream, int | np.integer):
        return int
    if hasattr(stream, "__cuda_stream__"):
        return lambda s: int(s.__cuda_stream__()[1])
    if hasattr(stream, "cuda_stream"):  # torch
        return lambda s: int(s.cuda_stream)
    if hasattr(stream, "ptr"):  # CuPy
        return lambda s: int(s.ptr)
    if hasattr(stream, "handle"):  # Numba, cuda.core

        def read(s) -> int:
            handle = s.handle
            value = getattr(handle, "value", None)
            return int(handle) if value is None else int(value)

        return read
    return None


_STREAM_GETTERS: dict = {}  # stream type -> its _stream_getter


def stream_handle(stream: Any) -> int:
    """The CUstream handle of a stream object or int (see the module docstring)."""
    kind = type(stream)
    if kind is int:
        return LEGACY if stream == 1 else stream
    if stream is None:
        return LEGACY
    getter = _STREAM_GETTERS.get(kind)
    if getter is None:
        getter = _stream_getter(stream)
        if getter is None:
            raise TypeError(
                f"stream must be a CuPy, PyTorch, Numba or cuda.core stream or a CUstream "
                f"handle, got {kind.__name__}"
            )
        _STREAM_GETTERS[kind] = getter
    value = getter(stream)
    return LEGACY if value == 1 else value


def resolve_stream(stream: Any, *arrays: Any) -> int:
    """The stream a call runs on: `stream` if given, else the first array's own
    (DeviceArray.stream, from its interface's `stream` entry), else the legacy
    default stream."""
    if stream is not None:
        return stream_handle(stream)
    for arr in arrays:
        if type(arr) is DeviceArray:
            return arr.stream
    return LEGACY
