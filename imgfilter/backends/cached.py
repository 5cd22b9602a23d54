"""The CUDA backend's quick start: kernels compiled on an earlier run, launched without Numba.

Importing Numba's CUDA target and loading its kernel cache take about two seconds,
far longer than filtering a photo. When cubins exported by the CUDA backend
(`imgfilter.backends.cubins`) exist for this GPU, `get_backend` hands out this module
instead: box blurs and contour maps of host images, filters that method auto gives the
register-blocked kernel and filters with the size-generic window or tiled kernels, run
from those cubins through the CUDA driver (`kernels.common.cudadrv`, the package's one
launch layer, and its memory pool) with the very kernels and arguments the Numba path
would launch, so results are identical; box_running (float32 boxes) runs through
`kernels.common.launch`, which finds its shipped cubins by name (`kernels.common.refs`).
Anything else (other kernels, other methods, device arrays, a missing cubin, a driver
error) is passed to `imgfilter.backends.cuda`, which imports Numba then. Same contract
as every backend.
Device arrays run here too inside `device_arrays()`: the row bands of a large host image
(`imgfilter.streamed`) and the pixel classifier's feature planes (`imgfilter.classify.cuda`).
Set IMGFILTER_NO_QUICK_START=1 to always use the Numba path.

First use: the package ships size-generic kernels (`kernels.common.shipped`). Where the kernel
method auto picks is specialised for a size and not compiled yet (a box of a new size,
a filter of a new kernel size), this module runs the shipped generic kernel, which gives
the same results, and starts that compile in a detached process
(`imgfilter.backends.background`); later calls find its cubin. With background compiles
off, such a call goes to the Numba path, which compiles at once.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import numpy as np

from kernels.box import plan as box_plan
from kernels.common import devarray
from kernels.common.cudadrv import CudaError, Driver, array_params, scalar_param
from kernels.common.cudadrv import driver as cuda_driver
from kernels.common.launch import image_grid
from kernels.common.saturate import output_limits
from kernels.contour import plan as contour_plan
from kernels.conv import plan as conv_plan

from . import background, cubins, warmup

NAME = "cuda"
# Each calling thread's own default stream: the calls here wait for their results, and
# several threads (the many-files pipeline's filter threads) overlap their copies.
_STREAM = devarray.PER_THREAD


class _Caller(threading.local):
    """What a quick call running in this thread was given: its out= (`_results_into`),
    the stream of a device array's work, and whether device arrays are taken
    (`device_arrays`)."""

    out = None
    stream = _STREAM
    device = False


_CALLER = _Caller()


@contextlib.contextmanager
def _results_into(out, stream: int | None = None):
    """While active, `_run` writes a result of out's shape and dtype straight into
    `out` instead of a new array: a writable C-contiguous host array (one host copy
    fewer, and a bus-speed copy when `out` is page-locked, `imgfilter.pinned`), or a
    C-contiguous device out. `stream`: where a device array's work goes."""
    host = isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable
    device = isinstance(out, devarray.DeviceArray) and out.is_c_contiguous
    _CALLER.out = out if host or device else None
    _CALLER.stream = _STREAM if stream is None else stream
    try:
        yield
    finally:
        _CALLER.out, _CALLER.stream = None, _STREAM


def _caller_out(shape: tuple, dtype, kind: type):
    """The caller's out= when it is a `kind` (np.ndarray or DeviceArray) a result of
    this shape and dtype can go straight into, else None."""
    out = _CALLER.out
    if isinstance(out, kind) and tuple(out.shape) == tuple(shape) and out.dtype == dtype:
        return out
    return None


@contextlib.contextmanager
def device_arrays():
    """While active in this thread, C-contiguous DeviceArrays given with a stream handle
    (the row bands of a host image streamed through the GPU, `imgfilter.streamed`; the
    classifier's feature planes) run through the quick start too, on that stream, their
    results written into the caller's device out or a new pool array, and
    `imgfilter.backends.get_backend` hands out this module for device arrays. Outside
    it, device arrays go to the Numba path, whose launch layer records them for replay."""
    before = _CALLER.device
    _CALLER.device = True
    try:
        yield
    finally:
        _CALLER.device = before


def taking_device_arrays() -> bool:
    """Whether this thread is inside `device_arrays`."""
    return _CALLER.device


def _quick_input(img, stream) -> bool:
    """Whether a call on `img` may run here: a host image without a stream, or, inside
    `device_arrays`, a C-contiguous DeviceArray with its stream handle."""
    if isinstance(img, np.ndarray):
        return stream is None
    return (_CALLER.device and isinstance(img, devarray.DeviceArray) and img.is_c_contiguous
            and type(stream) is int)  # fmt: skip


def _contiguous(img):
    return np.ascontiguousarray(img) if isinstance(img, np.ndarray) else img


@functools.cache
def _driver() -> Driver | None:
    if warmup.started():  # the CLI began opening it in the background
        return warmup.driver()
    try:
        return cuda_driver()
    except CudaError:
        return None


def available() -> bool:
    """True when a GPU answers and cubins for it and these kernel sources are cached."""
    if os.environ.get("IMGFILTER_NO_QUICK_START") == "1":
        return False
    drv = _driver()
    return drv is not None and cubins.any_for(drv.cc)


def _numba_backend():
    from . import cuda

    return cuda


_functions: dict = {}
_functions_lock = threading.Lock()


def _function(drv: Driver, name: str):
    """The loaded kernel `name` (each cubin is loaded once per process), or None."""
    with _functions_lock:
        if name not in _functions:
            found = cubins.load(name, drv.cc)
            if found is None:
                return None
            _functions[name] = drv.function(*found)
        return _functions[name]


def _on_device(img, out_shape: tuple, work):
    """work(stream, d_img, d_out) on host image img copied to the device (result copied
    back) or on a device array in place (`device_arrays`: the caller's stream; the
    result, returned, in the caller's device out, else in a new pool array on that
    stream). Device memory comes from the pool (`kernels.common.devarray`); host images
    go on the calling thread's default stream."""
    device = isinstance(img, devarray.DeviceArray)
    stream = _CALLER.stream if device else _STREAM
    if device:
        d_img, d_out = img, _caller_out(out_shape, img.dtype, devarray.DeviceArray)
        if d_out is None:
            d_out = devarray.empty(out_shape, img.dtype, stream)
    else:
        d_img = devarray.to_device(img, stream)
        d_out = devarray.empty(out_shape, img.dtype, stream)
    work(stream, d_img, d_out)
    if device:
        return d_out
    return d_out.copy_to_host(_caller_out(out_shape, img.dtype, np.ndarray))


def _run(name: str, img, out_shape: tuple, launch, extra=None, scratch_bytes: int = 0):
    """launch(driver, fn, stream, d_img, d_out[, d_extra]) of cubin `name` on img
    (`_on_device`), with the host array `extra` copied to the device, or scratch_bytes
    of uninitialised device memory, as d_extra; None when the cubin is missing or the
    driver fails."""
    drv = _driver()
    if drv is None:
        return None
    try:
        fn = _function(drv, name)
        if fn is None:
            return None

        def work(stream, d_img, d_out):
            # d_extra is held until its launches are queued: dropped sooner, its pool
            # block could go to another thread's allocation on this stream first.
            d_extra = None
            if extra is not None:
                d_extra = devarray.to_device(extra, stream)
            elif scratch_bytes:
                d_extra = devarray.empty((scratch_bytes,), np.uint8, stream)
            pointers = [d_img.ptr, d_out.ptr] + ([] if d_extra is None else [d_extra.ptr])
            launch(drv, fn, stream, *pointers)
            del d_extra

        return _on_device(img, out_shape, work)
    except CudaError:
        return None


def _running_quick(img, ksize, anchor, border, value):
    """`kernels.box.running.box_running` (float32 images, and boxes the one-pass kernels
    decline) through the launch layer, which runs the shipped cubins of its kernels
    without Numba (`kernels.common.refs`; one that does not ship is compiled); None
    when the driver fails."""
    if _driver() is None:
        return None
    from kernels.box.running import box_running

    def work(stream, d_img, d_out):
        box_running(d_img, ksize, anchor, border, value, d_out, stream)

    try:
        return _on_device(img, img.shape, work)
    except CudaError:
        return None


def _box_quick(img, ksize, anchor, border, value) -> np.ndarray | None:
    method, geo = box_plan.choose(img.shape, img.dtype, ksize)  # as box_auto chooses
    result = _box_method(method, geo, img, ksize, anchor, border, value)
    if result is None and method in ("tiled", "packed"):
        result = _box_first_use(method, geo, img, ksize, anchor, border, value)
    return result


def _box_method(method, geo, img, ksize, anchor, border, value) -> np.ndarray | None:
    """Run box kernel `method` with geometry `geo` from its cubin ("running": from the
    launch layer); None if it has none."""
    if method == "tiled":
        return _tiled_quick(img, ksize, anchor, border, value, geo)
    if method == "packed":
        return _packed_quick(img, ksize, anchor, border, value, geo)
    if method == "twopass":
        return _twopass_quick(img, ksize, anchor, border, value, geo)
    if method == "fused":
        return _fused_quick(img, ksize, anchor, border, value, geo)
    return _running_quick(img, ksize, anchor, border, value)


def _box_first_use(method, geo, img, ksize, anchor, border, value) -> np.ndarray | None:
    """The box through box_twopass, which takes any box size, while a detached process
    compiles the kernel specialised for this size; None when that cannot be."""
    twopass = box_plan.twopass_plan(img.shape, img.dtype, ksize)
    if twopass is None:
        return None
    if method == "tiled":
        name = cubins.tiled_name(geo, img.shape[2], ksize)
    else:
        name = cubins.packed_name(geo, img.shape[2])
    if not background.compile_box(name, img.shape, img.dtype.name, ksize):
        return None
    return _twopass_quick(img, ksize, anchor, border, value, twopass)


def _fused_quick(img, ksize, anchor, border, value, geo) -> np.ndarray | None:
    channels = img.shape[2]
    flat = (img.size,)
    args = box_plan.scalar_args(img.shape, ksize, anchor, border, value, geo)

    def launch(drv, fn, stream, d_img, d_out):
        params = array_params(d_img, flat, img.dtype)
        params += [scalar_param(a) for a in args]
        params += array_params(d_out, flat, img.dtype)
        drv.launch_params(fn, geo["grid"], (geo["threads"],), geo["smem"], stream, params)

    return _run(cubins.box_name(geo, channels, img.dtype), img, img.shape, launch)


def _twopass_quick(img, ksize, anchor, border, value, geo) -> np.ndarray | None:
    """box_twopass: its row pass into a device scratch, then its column pass."""
    rows, columns = cubins.twopass_names(img.shape[2], geo)
    row_args, col_args = box_plan.twopass_args(img.shape, ksize, anchor, border, value, geo)
    n, n_sums = img.size, img.shape[0] * geo["pitch16"] // 2

    def launch(drv, fn, stream, d_img, d_out, d_sums):
        column_fn = _function(drv, columns)
        if column_fn is None:
            raise CudaError(f"no cached cubin for {columns}")
        params = array_params(d_img, (n,), np.uint8) + array_params(d_img, (n // 4,), np.uint32)
        params += [scalar_param(a) for a in row_args]
        params += array_params(d_sums, (n_sums,), np.uint32)
        drv.launch_params(
            fn, geo["row_grid"], (geo["row_threads"],), geo["row_smem"], stream, params
        )
        params = array_params(d_sums, (n_sums,), np.uint32)
        params += [scalar_param(a) for a in col_args]
        params += array_params(d_out, (n,), np.uint8)
        drv.launch_params(
            column_fn, geo["col_grid"], geo["col_block"], geo["col_smem"], stream, params
        )

    return _run(rows, img, img.shape, launch, scratch_bytes=4 * n_sums)


def _packed_quick(img, ksize, anchor, border, value, geo) -> np.ndarray | None:
    args = box_plan.packed_args(img.shape, ksize, anchor, border, value, geo)
    name = cubins.packed_name(geo, img.shape[2])
    return _word_kernel_quick(img, geo, args, name)


def _tiled_quick(img, ksize, anchor, border, value, geo) -> np.ndarray | None:
    args = box_plan.tiled_args(img.shape, ksize, anchor, border, value, geo)
    name = cubins.tiled_name(geo, img.shape[2], ksize)
    return _word_kernel_quick(img, geo, args, name)


def _word_kernel_quick(img, geo, args, name: str) -> np.ndarray | None:
    """Launch a cached uint8 box kernel that reads and writes the images as bytes and as
    their whole 32-bit words (box_packed, box_tiled): (src8, src32, n_words, *args,
    out8, out32)."""
    n = img.size

    def launch(drv, fn, stream, d_img, d_out):
        params = array_params(d_img, (n,), np.uint8) + array_params(d_img, (n // 4,), np.uint32)
        params += [scalar_param(a) for a in (n // 4, *args)]
        params += array_params(d_out, (n,), np.uint8)
        params += array_params(d_out, (n // 4,), np.uint32)
        drv.launch_params(fn, geo["grid"], (geo["threads"],), geo["smem"], stream, params)

    return _run(name, img, img.shape, launch)


def _contour_quick(img, border, value) -> np.ndarray | None:
    height, width, channels = img.shape
    args = contour_plan.scalar_args(img.dtype, border, int(value))

    def launch(drv, fn, stream, d_img, d_out):
        params = array_params(d_img, img.shape, img.dtype)
        params += array_params(d_img, (img.size,), img.dtype)
        params += [scalar_param(a) for a in args]
        params += array_params(d_out, (height, width), img.dtype)
        params += array_params(d_out, (height * width,), img.dtype)
        grid = contour_plan.grid(height, width)
        drv.launch_params(fn, grid, (contour_plan.THREADS,), 0, stream, params)

    return _run(cubins.contour_name(channels, img.dtype), img, (height, width), launch)


def _blocked_quick(img, kernel, anchor, border, value) -> np.ndarray | None:
    kh, kw = kernel.shape
    weights = np.ascontiguousarray(kernel, dtype=np.float32).reshape(kh * kw)
    cval = np.dtype(img.dtype).type(value)
    args = conv_plan.scalar_args(img.dtype, anchor, border, cval)

    def launch(drv, fn, stream, d_img, d_out, d_weights):
        params = array_params(d_img, img.shape, img.dtype)
        params += array_params(d_weights, weights.shape, np.float32)
        params += [scalar_param(a) for a in args]
        params += array_params(d_out, img.shape, img.dtype)
        drv.launch_params(
            fn,
            conv_plan.grid(img.shape, kh),
            (conv_plan.TX, conv_plan.TY),
            0,
            stream,
            params,
        )

    name = cubins.blocked_name(kh, kw, img.dtype)
    return _run(name, img, img.shape, launch, extra=weights)


def _conv_generic_quick(method, img, kernel, anchor, border, value) -> np.ndarray | None:
    """A size-generic correlation kernel, which takes the kernel size as an argument:
    method "window" (`kernels.conv.window.correlate_window`) or "tiled"
    (`kernels.conv.generic.correlate_tiled`); None where its tile does not fit."""
    kh, kw = kernel.shape
    if method == "window":
        smem = conv_plan.window_smem_bytes(kh, kw)
        grid = conv_plan.window_grid(img.shape)
        block = (conv_plan.WINDOW_TX, conv_plan.WINDOW_TY, 1)
        name = cubins.conv_window_name(img.dtype)
    else:
        smem = conv_plan.tiled_smem_bytes(kh, kw)
        grid, block = image_grid(*img.shape)
        name = cubins.conv_tiled_name(img.dtype)
    if smem > conv_plan.SMEM_LIMIT:
        return None
    weights = np.ascontiguousarray(kernel, dtype=np.float32)
    lo, hi, is_int = output_limits(img.dtype)
    cval = np.dtype(img.dtype).type(value)
    args = (anchor[0], anchor[1], border, cval, lo, hi, is_int)

    def launch(drv, fn, stream, d_img, d_out, d_weights):
        params = array_params(d_img, img.shape, img.dtype)
        params += array_params(d_weights, weights.shape, np.float32)
        params += [scalar_param(a) for a in args]
        params += array_params(d_out, img.shape, img.dtype)
        drv.launch_params(fn, grid, block, smem, stream, params)

    return _run(name, img, img.shape, launch, extra=weights)


def _correlate_first_use(img, kernel, anchor, border, value) -> np.ndarray | None:
    """The filter through the window kernel while a detached process compiles the
    register-blocked kernel for this size; None when that cannot be."""
    kh, kw = kernel.shape
    if not conv_plan.window_fits(kh, kw):
        return None
    if not background.compile_blocked(kh, kw, img.dtype.name):
        return None
    return _conv_generic_quick("window", img, kernel, anchor, border, value)


def _into(result: np.ndarray, out):
    if out is None or result is out:
        return result
    out[...] = result
    return out


def box(img, ksize, anchor, border, value, method, out=None, stream=None, fallback=None):
    """cv2.blur semantics; see imgfilter.backends and imgfilter.backends.cuda.box.
    Host images without a stream (and, inside `device_arrays`, device arrays with their stream)
    only; anything else goes to `fallback()` (the backend `for_request` names; default
    the Numba path)."""
    if method == "auto" and _quick_input(img, stream):
        with _results_into(out, stream):
            result = _box_quick(_contiguous(img), ksize, anchor, border, value)
        if result is not None:
            return _into(result, out)
    backend = (fallback or _numba_backend)()
    return backend.box(img, ksize, anchor, border, value, method, out, stream)


def contour(img, border, value, method, out=None, stream=None, fallback=None):
    """The fused contour map; see imgfilter.backends.cuda.contour."""
    if _quick_input(img, stream):
        with _results_into(out, stream):
            result = _contour_quick(_contiguous(img), border, value)
        if result is not None:
            return _into(result, out)
    return (fallback or _numba_backend)().contour(img, border, value, method, out, stream)


def correlate(img, kernel, anchor, border, value, method, out=None, stream=None,
              fallback=None):  # fmt: skip
    """cv2.filter2D semantics; the register-blocked kernel runs from its cubin where
    method auto (or blocked) picks it, the size-generic window and tiled kernels where
    asked for or where auto runs them (kernels larger than the blocked kernel takes),
    anything else through Numba."""
    auto = conv_plan.auto_method(kernel) if method == "auto" else None
    generic = method if method in ("window", "tiled") else None
    if method == "auto" and auto is None:
        generic = conv_plan.generic_method(*kernel.shape)
    if generic in ("window", "tiled") and _quick_input(img, stream):
        img = _contiguous(img)
        with _results_into(out, stream):
            result = _conv_generic_quick(generic, img, kernel, anchor, border, value)
        if result is not None:
            return _into(result, out)
    quick = method == "blocked" or auto == "blocked"
    # The exported cubin is the 32-bit-offset variant: larger images go through Numba.
    fits = conv_plan.fits(*kernel.shape) and conv_plan.offsets_fit(img.shape)
    if quick and fits and _quick_input(img, stream):
        img = _contiguous(img)
        with _results_into(out, stream):
            result = _blocked_quick(img, kernel, anchor, border, value)
            if result is None and method == "auto":
                result = _correlate_first_use(img, kernel, anchor, border, value)
        if result is not None:
            return _into(result, out)
    backend = (fallback or _numba_backend)()
    return backend.correlate(img, kernel, anchor, border, value, method, out, stream)


class Quick:
    """This module as the backend of one request ("auto" or "cuda"): what the quick
    start cannot run goes to `fallback()`, the backend that request gets without it
    (the Numba path, or the CPU backend when auto finds no CUDA compiler)."""

    NAME = NAME

    def __init__(self, fallback) -> None:
        self._fallback = fallback

    def box(self, *args):
        return box(*args, fallback=self._fallback)

    def contour(self, *args):
        return contour(*args, fallback=self._fallback)

    def correlate(self, *args):
        return correlate(*args, fallback=self._fallback)

    device_arrays = staticmethod(device_arrays)


_QUICK: dict = {}


def for_request(name: str, fallback) -> Quick:
    """The quick start for backend request `name`, falling back to `fallback()`."""
    if name not in _QUICK:
        _QUICK[name] = Quick(fallback)
    return _QUICK[name]
