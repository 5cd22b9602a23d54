"""The CUDA backend: runs `kernels` on the GPU (or on Numba's simulator in tests).

Host arrays are copied to the device and the result copied back (the call waits for
it); device arrays (the API hands them over as `kernels.common.devarray.DeviceArray` views)
stay on the device: the work is queued on the call's stream and a device array is
returned at once, without waiting for the GPU. See `imgfilter.backends` for the
shared contract.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
from numba import config

from kernels.box import dispatch as _box
from kernels.box import fused as _box_fused
from kernels.box import packed as _box_packed
from kernels.box import tiled as _box_tiled
from kernels.box import twopass as _box_twopass
from kernels.common.arrays import (
    copy_rows,
    empty,
    empty_like,
    resolve_stream,
    to_device,
    to_host,
)
from kernels.common.border_index import WRAP
from kernels.common.border_index import border_index as _border_index
from kernels.common.cudadrv import CudaError, GpuOutOfMemory, NoMemoryForContext, driver
from kernels.common.launch import SMEM_LIMIT, Batching, Recording, compile_lock
from kernels.contour import kernel as _contour
from kernels.conv import blocked as _blocked
from kernels.conv import dispatch as _conv
from kernels.conv import plan as _conv_plan
from kernels.conv.plan import low_rank_factors

from .. import replay
from ..errors import DeviceError, GpuMemoryError, UsageError
from . import background, cubins

NAME = "cuda"
PER_THREAD_STREAM = 2  # CU_STREAM_PER_THREAD: the calling thread's own default stream

# Small images launch small grids; that is expected, not worth a warning to users.
config.CUDA_LOW_OCCUPANCY_WARNINGS = False
SIMULATOR = bool(config.ENABLE_CUDASIM)  # set before Numba is imported; read per call


def _export(kernel, name: str, array_dtypes: tuple) -> None:
    """Keep the compiled kernel's cubin on disk for the quick start (backends.cached)."""
    if not config.ENABLE_CUDASIM:
        with compile_lock:
            cubins.remember(kernel, name, array_dtypes, driver().cc)


class _Call:
    """One call's device input, stream and output, host or device (see `begin`)."""

    __slots__ = ("img", "stream", "from_host", "host_out", "out")

    def __init__(self, img, stream: int, from_host: bool, host_out, out) -> None:
        self.img, self.stream, self.from_host = img, stream, from_host
        self.host_out, self.out = host_out, out

    def finish(self, result):
        """The result as the caller gets it: copied back (into their `out`, if given)
        for a host input, else the device array itself."""
        if not self.from_host:
            return result
        host = to_host(result, self.stream)
        if self.host_out is None:
            return host
        self.host_out[...] = host
        return self.host_out


def begin(img, out, stream) -> _Call:
    """The device image (a host image is queued for upload), the stream the call runs
    on (`kernels.common.arrays.resolve_stream`) and where the result goes: a device `out` is
    written in place, a host `out` receives the copy."""
    if isinstance(img, np.ndarray):
        handle = resolve_stream(stream)
        host_out = out if isinstance(out, np.ndarray) else None
        dout = None if out is None or host_out is not None else out
        return _Call(to_device(img, handle), handle, True, host_out, dout)
    return _Call(img, resolve_stream(stream, img), False, None, out)


_lock = threading.Lock()
_WEIGHTS: dict = {}
_WEIGHTS_KEEP = 16


def _device_weights(kernel: np.ndarray, stream: int):
    """The kernel as a float32 device array, uploaded once per stream and kept: later
    calls on the stream find it there, ordered after its upload."""
    key = (stream, kernel.shape, kernel.tobytes())
    with _lock:
        weights = _WEIGHTS.pop(key, None)
        if weights is None:
            # np.array copies: a broadcast view (stride 0) would not reshape on the device.
            weights = to_device(np.array(kernel, dtype=np.float32, order="C"), stream)
        _WEIGHTS[key] = weights
        while len(_WEIGHTS) > _WEIGHTS_KEEP:
            _WEIGHTS.pop(next(iter(_WEIGHTS)))
    return weights


_RECIPES: dict = {}
_RECIPES_KEEP = 256


def _queue(key: tuple, call: _Call, out_shape: tuple, run, rows: tuple = (0, 0), border: int = 0,
           band_rows: int | None = None):  # fmt: skip
    """`_on_device` for a call's device image (a host image once uploaded, or one of
    a batch's): `run(img, out)` queued on the call's stream into the call's out, or a
    new array of `out_shape`, which is returned."""
    return _on_device(key, call.img, call.out, call.stream, out_shape,
                      lambda src, dst, handle: run(src, dst), rows, border, band_rows)  # fmt: skip


def _queue_batch(key: tuple, batch, out, stream: int, run):
    """`_queue` for a batch: the launches of its first image made for every image
    (`kernels.common.launch.Batching`: one launch per kernel where it can), recorded and
    replayed as one recipe; each image on its own where the images do not keep the
    first one's 16-byte alignment."""
    n = batch.shape[0]
    step_in, step_out = batch.strides[0], out.strides[0]
    if step_in % 16 or step_out % 16:
        for i in range(n):
            _queue(key, _Call(batch[i], stream, False, None, out[i]), out.shape[1:], run)
        return out
    batching = Batching(n, ((batch[0], step_in), (out[0], step_out)))
    if config.ENABLE_CUDASIM:
        with compile_lock, batching:
            run(batch[0], out[0])
        return out
    _replay_or_record(key, batch, out, stream, run, batching)
    return out


def _replay_or_record(key: tuple, img, out, stream: int, run, batching=None):
    """Replay the recipe of (key, img's shape, dtype and alignments, stream) on img and out,
    or run and record it; returns the recipe (None if the launches cannot be
    replayed). With `batching`, img and out are batches and run gets their first
    images under it."""
    key = (key, img.shape, img.dtype.num, img.ptr & 15, out.ptr & 15, stream)
    recipe = _RECIPES.get(key)
    if recipe is not None:
        recipe.replay([img.ptr, out.ptr], stream)
        return recipe
    with Recording((img, out)) as recording:
        if batching is None:
            run(img, out)
        else:
            with batching:
                run(img[0], out[0])
    recipe = recording.recipe()
    if recipe is not None:
        with _lock:
            _RECIPES[key] = recipe
            while len(_RECIPES) > _RECIPES_KEEP:
                _RECIPES.pop(next(iter(_RECIPES)))
    return recipe


def _on_device(key: tuple, img, out, stream, out_shape: tuple, record, rows: tuple,
               border: int, band_rows: int | None = None):  # fmt: skip
    """A device image's call: queued on its stream (`kernels.common.arrays.resolve_stream`)
    into `out` (allocated there when None), which is returned at once. `record(src,
    dst, handle)` makes the launches: on a first call of its key, shapes, alignments
    and stream, recorded (`kernels.common.launch.Recording`); later calls replay them, a few
    microseconds of Python. `key` holds every option that shapes the launches
    besides the arrays (kernel size, anchor, border, value, method...). `rows` =
    (above, below): the rows of neighbours an output row reads, and `border` the
    vertical border rule, for images filtered in bands of at most `band_rows` rows
    (`_in_row_bands`; default MAX_GRID_ROWS, the rows one grid covers). CUDA failures
    as `_run` says."""
    handle = resolve_stream(stream, img)
    try:
        if out is None:
            same = out_shape is img.shape  # C-contiguous, as the API checked
            out = empty_like(img, handle) if same else empty(out_shape, img.dtype, handle)
        ndim = len(img.shape)
        band_rows = band_rows or MAX_GRID_ROWS
        if img.shape[ndim - 3] > band_rows:
            images = [(img, out)] if ndim == 3 else [(img[i], out[i]) for i in range(len(img))]
            for one, dst in images:
                _in_row_bands(key, one, dst, handle, record, rows, border, band_rows)
            return out
        if ndim == 4:
            return _queue_batch(key, img, out, handle, lambda s, d: record(s, d, handle))
        if SIMULATOR:
            with compile_lock:  # the simulator swaps the kernel modules' globals meanwhile
                record(img, out, handle)
            return out
        recipe = _RECIPES.get((key, img.shape, img.dtype.num, img.ptr & 15, out.ptr & 15, handle))
        if recipe is not None:
            recipe.replay([img.ptr, out.ptr], handle)
        else:
            recipe = _replay_or_record(key, img, out, handle, lambda s, d: record(s, d, handle))
        replay.note(img, out, recipe)
        return out
    except GpuOutOfMemory as exc:  # pragma: no cover - real GPU only
        raise GpuMemoryError(f"{exc}; try --backend cpu") from exc
    except CudaError as exc:  # pragma: no cover - real GPU only
        raise DeviceError(f"CUDA error: {exc}") from exc


# Rows of an image that one launch covers: every kernel's grid then stays within
# CUDA's 65535 blocks along y (the kernels give each block at least one row).
MAX_GRID_ROWS = 32768
# The fast uint8 box kernels (box_tiled, box_twopass, box_packed) address images of
# fewer than FAST_BOX_BYTES bytes; box_auto gives larger ones to box_fused, which ran
# about half as fast on an H200 (benchmarks/tall_device.py). Such images are boxed in
# bands of rows of at most BOX_BAND_BYTES instead: box_twopass's 16-bit scratch is
# twice a band.
FAST_BOX_BYTES = 2**31
BOX_BAND_BYTES = 2**29


def _box_band_rows(shape: tuple, dtype, ksize: tuple, rows: tuple) -> int:
    """Rows per band for box_auto on an (H, W, C) image, rows = (above, below) its box's
    reach: MAX_GRID_ROWS, or fewer where the image is too large for the fast uint8
    kernels: bands of at most BOX_BAND_BYTES with their reach, at least 8 times the
    reach (so that the rows filtered twice stay few), where the fast kernels take them."""
    h, w, c = shape
    if dtype != np.uint8 or h * w * c < FAST_BOX_BYTES:
        return MAX_GRID_ROWS
    reach = rows[0] + rows[1]
    most = min(MAX_GRID_ROWS, BOX_BAND_BYTES // (w * c) - reach)
    if most < 8 * max(reach, 1):
        return MAX_GRID_ROWS
    band = _box.box_method((most + reach, w, c), dtype, ksize)
    return most if band != _box.box_method(shape, dtype, ksize) else MAX_GRID_ROWS


def _row_bands(height: int, rows: tuple, wrap: bool, most: int) -> list[tuple[int, int]]:
    """The (y0, y1) bands `_in_row_bands` filters, in order, covering rows 0 .. height - 1
    with at most `most` rows each. Under the wrap rule the first band holds `above`
    rows and the last `below` (at least one each), so only those two reach past the
    image's ends and need its far rows gathered; the bands between them read real
    rows only."""
    above, below = max(rows[0], 1), max(rows[1], 1)
    if not wrap or above + below >= height:
        return [(y0, min(height, y0 + most)) for y0 in range(0, height, most)]
    middle = [(y0, min(height - below, y0 + most)) for y0 in range(above, height - below, most)]
    return [(0, above), *middle, (height - below, height)]


def _in_row_bands(key: tuple, img, out, handle: int, record, rows: tuple, border: int,
                  most: int) -> None:  # fmt: skip
    """Filter a device image in bands of at most `most` rows (`_row_bands`), queued on
    `handle`; the result equals the whole image's.

    rows = (above, below): the rows of neighbours an output row reads. A band is
    filtered as an image of its own from the image's rows lo = y0 - above .. hi - 1 =
    y1 + below - 1 (cut at the image's ends, where the image's border rule is then the
    band's): its output rows y0 .. y1 - 1 read real neighbours only, the rows before
    and after them do not. The band writes straight into `out`'s rows lo .. hi - 1:
    the rows after y1 are written again by the next band, and the rows before y0,
    which the bands before wrote right, are saved before the launch and put back
    after it (a copy of at most max(above, below) rows, where a scratch band would cost
    a copy of the whole result and its memory). Under wrap the first and last bands,
    which read rows from the far end, are a few rows each, gathered into scratch."""
    height = img.shape[0]
    above, below = rows
    wrap = border == WRAP
    before = min(height, max(above, below))  # rows before y0 a band may write
    kept = empty((before, *out.shape[1:]), out.dtype, handle) if before else None

    def run(src, dst) -> None:
        if config.ENABLE_CUDASIM:
            with compile_lock:
                record(src, dst, handle)
        else:
            _replay_or_record(key, src, dst, handle, lambda s, d: record(s, d, handle))

    for y0, y1 in _row_bands(height, rows, wrap, most):
        lo, hi = y0 - above, y1 + below
        if wrap and (lo < 0 or hi > height):
            src = _gathered_rows(img, lo, hi, handle)
            band = empty((hi - lo, *out.shape[1:]), out.dtype, handle)
            run(src, band)
            copy_rows(out[y0:y1], band[above : above + y1 - y0], handle)
            continue
        # A band at the image's top (bottom) also holds the rows a reflecting border
        # reads there: `above` (`below`) rows into the image, past a short band.
        lo = max(0, min(lo, height - 1 - below))
        hi = min(height, max(hi, above + 1))
        if lo < y0:
            copy_rows(kept[: y0 - lo], out[lo:y0], handle)
        run(img[lo:hi], out[lo:hi])
        if lo < y0:
            copy_rows(out[lo:y0], kept[: y0 - lo], handle)


def _gathered_rows(img, lo: int, hi: int, handle: int):
    """Rows lo .. hi - 1 of `img` under the wrap rule (rows before 0 or from `height`
    on come from the far end), gathered into a new device array."""
    height = img.shape[0]
    src = empty((hi - lo, *img.shape[1:]), img.dtype, handle)
    at = lo
    while at < hi:
        y = at % height
        n = min(hi - at, height - y)
        copy_rows(src[at - lo : at - lo + n], img[y : y + n], handle)
        at += n
    return src


@functools.lru_cache(maxsize=64)
def _prepared(shape: tuple, data: bytes, method: str) -> tuple[str, tuple]:
    """(resolved method, low-rank factors as ((row, col, row_sum), ...) for
    "separable") for a kernel given by its shape and bytes: the SVD runs once."""
    kernel = np.frombuffer(data, dtype=np.float32).reshape(shape)
    method = _resolve_correlation_method(method, kernel)
    if method != "separable":
        return method, ()
    kh, kw = shape
    terms = tuple(
        (
            row[None, :].astype(np.float32),
            col[:, None].astype(np.float32),
            float(np.sum(row, dtype=np.float64)),
        )  # fmt: skip
        for col, row in low_rank_factors(kernel, _conv_plan.max_separable_rank(kh, kw))
    )
    return method, terms


def _resolve_correlation_method(method: str, kernel: np.ndarray) -> str:
    kh, kw = kernel.shape
    if method == "separable":
        most, rank = _conv_plan.max_separable_rank(kh, kw), _conv_plan.kernel_rank(kernel)
        if rank > most:
            raise UsageError(
                f"method 'separable' needs a rank-1 kernel (an outer product) or, for a "
                f"{kh}x{kw} kernel, a sum of at most {most} of them; this one has rank {rank}"
            )
        if max(kh, kw) > _conv_plan.MAX_SIDE:
            raise UsageError(f"method 'separable' handles kernels up to {_conv_plan.MAX_SIDE} wide")
        return method
    if method == "auto":
        return _conv_plan.auto_method(kernel) or _conv_plan.generic_method(kh, kw)
    if method == "blocked" and not _conv_plan.fits(kh, kw):
        raise UsageError(
            f"method 'blocked' handles kernels up to {_conv_plan.MAX_SIDE}x{_conv_plan.MAX_SIDE}; "
            "use tiled, padded or naive"
        )
    if method == "window" and not _conv_plan.window_fits(kh, kw):
        raise UsageError(
            f"method 'window' needs {_conv_plan.window_smem_bytes(kh, kw)} bytes of shared memory "
            f"for a {kh}x{kw} kernel (limit {SMEM_LIMIT}); use tiled, padded or naive"
        )
    if method == "tiled" and not _conv_plan.tiled_fits(kh, kw):
        raise UsageError(
            f"method 'tiled' needs {_conv_plan.tiled_smem_bytes(kh, kw)} bytes of shared memory "
            f"for a {kh}x{kw} kernel (limit {SMEM_LIMIT}); use naive or padded"
        )
    return method


def _run(fn):
    """Call fn(), turning CUDA failures into DeviceError (GpuMemoryError when the GPU
    is out of memory)."""
    try:
        return fn()
    except GpuOutOfMemory as exc:  # pragma: no cover - real GPU only
        raise GpuMemoryError(f"{exc}; try --backend cpu") from exc
    except CudaError as exc:  # pragma: no cover - real GPU only
        raise DeviceError(f"CUDA error: {exc}") from exc


def _run_or_bands(go, img, out, rows: tuple, border: int, value, again):
    """`_run(go)`; when the GPU has not the memory for a host image, filter it in
    bands of rows instead (`_in_bands`), each with its halo about half the image,
    each split again as needed."""
    try:
        return _run(go)
    except GpuMemoryError as exc:
        height = img.shape[0]
        band = (height - sum(rows)) // 2
        no_context = isinstance(exc.__cause__, NoMemoryForContext)  # no band could run
        if not isinstance(img, np.ndarray) or band < 1 or no_context:
            raise  # device images stay whole; a band with its halo would be no smaller
    return _in_bands(img, out, band, rows, border, value, again)


def _in_bands(img: np.ndarray, out, band: int, rows: tuple, border: int, value, again):
    """Filter a host image band by band, each band with `rows` = (above, below) rows
    of halo taken from the image under its vertical border rule (constant rows of
    `value` where the rule says so), so that the rows kept from each band read only
    real neighbours: for integer images the result equals the whole image's
    (float32 within the rounding of a different summation order)."""
    height = img.shape[0]
    above, below = rows
    first = None
    for y0 in range(0, height, band):
        y1 = min(height, y0 + band)
        index = np.array([_border_index(y, height, border) for y in range(y0 - above, y1 + below)])
        src = img[np.clip(index, 0, None)]
        if (index < 0).any():
            src[index < 0] = value
        part = again(np.ascontiguousarray(src))[above : above + y1 - y0]
        if first is None:
            first = out if out is not None else np.empty((height, *part.shape[1:]), part.dtype)
        first[y0:y1] = part
    return first


def _correlate_launches(src, dst, handle: int, kernel, terms, anchor, border, value, method):
    """Queue the correlation of src into dst on `handle`. The weights are uploaded
    (once per stream) before the kernels are launched: constants to a recording,
    which is why recipes are kept per stream (the handle is in their key)."""
    cval = np.dtype(src.dtype).type(value)
    if method == "separable":
        dterms = [
            (_device_weights(row, handle), _device_weights(col, handle), row_sum)
            for row, col, row_sum in terms
        ]
        _blocked.correlate_low_rank(src, dterms, anchor, border, cval, dst, handle)
    else:
        weights = _device_weights(kernel, handle)
        _conv.correlate(src, weights, anchor, border, cval, method, dst, handle)


# ------------------------------------------------------- first use of a kernel size
#
# Method auto's register-blocked kernel is generated and compiled for each kernel
# size (NVVM: 3-10 s). Until that compile is on disk (its cubin, exported by the
# compile), auto runs the register-window kernel, which takes any size as an
# argument (compiled once per dtype; the same results), and a detached process
# compiles the blocked kernel into the caches: not a thread, whose Numba compile would
# hold the GIL and slow the caller's every call meanwhile. The calls after it load the
# blocked kernel from the cache (`imgfilter.backends.background`, whose ENABLED is
# False with IMGFILTER_BACKGROUND_COMPILE=0: then compile at once).
_BLOCKED_READY: set = set()  # (kh, kw, dtype name) whose blocked kernel can run now
_BLOCKED_PENDING: dict = {}  # (kh, kw, dtype name) -> when its cubin was last looked for
_LOOK_EVERY_S = 0.5


def _blocked_or_window(kh: int, kw: int, dtype) -> str:
    """ "blocked" when its kernel for this size and dtype is compiled (its cubin on
    disk), else "window", starting the blocked kernel's compile (once)."""
    key = (kh, kw, _dtype_name(dtype))
    if key in _BLOCKED_READY:
        return "blocked"
    now = time.monotonic()
    last = _BLOCKED_PENDING.get(key)
    if last is None or now - last >= _LOOK_EVERY_S:
        if cubins.load(cubins.blocked_name(kh, kw, dtype), driver().cc) is not None:
            _BLOCKED_READY.add(key)
            return "blocked"
        if not _conv_plan.window_fits(kh, kw):
            return "blocked"
        with _lock:
            start = key not in _BLOCKED_PENDING
            _BLOCKED_PENDING[key] = now
        if start and not background.compile_blocked(*key):
            return "blocked"  # no cache to compile into: compile here, at once
    return "window"


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    """np.dtype(dtype).name, kept (NumPy derives the name anew each time)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return name


def compile_box(name: str, shape: tuple, dtype: str, ksize: tuple) -> None:
    """In a detached process (`background.compile_box`): blur a zero image of this
    shape, which compiles and exports box kernel `name`, then remove its marker.
    Never raises."""
    with background.compiling(name):
        kh, kw = ksize
        box(np.zeros(shape, dtype), ksize, (kh // 2, kw // 2), 0, 0.0, "auto")


def compile_blocked(kh: int, kw: int, dtype: str) -> None:
    """Compile (or load) the register-blocked kernel for a kh x kw kernel on `dtype`
    images by running it once on a small image, and export its cubin (the sign for
    method auto, in this and other processes, that it is ready). Never raises: a
    failure leaves auto on the window kernel."""
    name = cubins.blocked_name(kh, kw, dtype)
    with background.compiling(name):
        stream = PER_THREAD_STREAM
        img = to_device(np.ones((8, 8, 1), dtype), stream)
        weights = _device_weights(np.ones((kh, kw), np.float32), stream)
        out = empty(img.shape, img.dtype, stream)
        cval = np.dtype(dtype).type(0)
        _conv.correlate(img, weights, (0, 0), 0, cval, "blocked", out, stream)
        driver().synchronize(stream)
        _export(_blocked.kernel_for(kh, kw), name, (np.dtype(dtype), np.float32, np.dtype(dtype)))
        _BLOCKED_READY.add((kh, kw, np.dtype(dtype).name))


# A device call's (key, record, rows) for `_on_device`, by its options: made once
# (closures and key tuples cost more than the lookup), at most _CALLS_KEEP of them.
_CALLS: dict = {}
_CALLS_KEEP = 512


def _keep_call(options: tuple, call: tuple) -> tuple:
    if len(_CALLS) >= _CALLS_KEEP:
        _CALLS.clear()
    _CALLS[options] = call
    return call


def _correlate_call(kernel: np.ndarray, data: bytes, anchor, border, value, method, dtype):
    """(key, record, rows, final) of a device correlation: `final` False while method
    auto runs the window kernel until the blocked one is compiled (not to be kept).
    The closure keeps the kernel as read-only bytes: a caller's array may change."""
    kernel = np.frombuffer(data, dtype=np.float32).reshape(kernel.shape)
    requested = method
    method, terms = _prepared(kernel.shape, data, method)
    final = True
    if requested == "auto" and method == "blocked" and background.ENABLED:
        if not config.ENABLE_CUDASIM:  # the simulator compiles nothing
            method = _blocked_or_window(*kernel.shape, dtype)
            final = method == "blocked"
    key = ("correlate", method, kernel.shape, data, anchor, border, value)

    def record(src, dst, handle):
        _correlate_launches(src, dst, handle, kernel, terms, anchor, border, value, method)

    return key, record, (anchor[0], kernel.shape[0] - 1 - anchor[0]), final


def correlate(img, kernel, anchor, border, value, method, out=None, stream=None):
    """cv2.filter2D semantics on the GPU; see imgfilter.backends."""
    kernel = np.ascontiguousarray(kernel, dtype=np.float32)
    data = kernel.tobytes()
    if not isinstance(img, np.ndarray):
        options = ("correlate", data, kernel.shape, anchor, border, value, method, img.dtype)
        call = _CALLS.get(options)
        if call is None:
            call = _correlate_call(kernel, data, anchor, border, value, method, img.dtype)
            if call[3]:
                _keep_call(options, call)
        key, record, rows, _ = call
        return _on_device(key, img, out, stream, img.shape, record, rows, border)
    requested = method
    method, terms = _prepared(kernel.shape, data, method)
    if requested == "auto" and method == "blocked" and background.ENABLED:
        if not config.ENABLE_CUDASIM:  # the simulator compiles nothing
            method = _blocked_or_window(*kernel.shape, img.dtype)

    def go():
        call = begin(img, out, stream)
        dimg, handle = call.img, call.stream
        key = ("correlate", method, kernel.shape, data, anchor, border, value)

        def run(src, dst):
            _correlate_launches(src, dst, handle, kernel, terms, anchor, border, value, method)

        rows = (anchor[0], kernel.shape[0] - 1 - anchor[0])
        dout = _queue(key, call, dimg.shape, run, rows, border)
        if method == "blocked" and call.from_host:
            kh, kw = kernel.shape
            name = cubins.blocked_name(kh, kw, dimg.dtype)
            _export(_blocked.kernel_for(kh, kw), name, (dimg.dtype, np.float32, dimg.dtype))
        return call.finish(dout)

    def again(band):
        return correlate(band, kernel, anchor, border, value, method, None, stream)

    kh = kernel.shape[0]
    return _run_or_bands(go, img, out, (anchor[0], kh - 1 - anchor[0]), border, value, again)


def box(img, ksize, anchor, border, value, method, out=None, stream=None):
    """cv2.blur semantics on the GPU, by the box kernel `method` names
    (`kernels.box.dispatch.box_by_name`; a case it does not take is a UsageError).

    auto: one pass for uint8/uint16 (`kernels.box.tiled` for uint8 boxes up to 41,
    else running sums in `kernels.box.fused` or `kernels.box.packed`), else a column
    running-sum pass then a row pass (cost ~ independent of k for running sums);
    tiled, twopass, fused, packed, running: that kernel; separable: a row-sum pass and
    a column-sum pass.
    """
    try:
        return _box_call(img, ksize, anchor, border, value, method, out, stream)
    except _box.MethodRefused as exc:
        raise UsageError(str(exc)) from None


def _box_call(img, ksize, anchor, border, value, method, out=None, stream=None):
    kh, kw = ksize
    run = _box.box_by_name(method)
    rows = (anchor[0], kh - 1 - anchor[0])
    if not isinstance(img, np.ndarray):
        options = ("box", method, ksize, anchor, border, value)
        call = _CALLS.get(options)
        if call is None:

            def record(src, dst, handle):
                run(src, ksize, anchor, border, value, dst, handle)

            call = _keep_call(options, (options, record, rows))
        key, record, rows = call
        most = _box_band_rows(img.shape[-3:], img.dtype, ksize, rows) if method == "auto" else None
        return _on_device(key, img, out, stream, img.shape, record, rows, border, most)

    def go():
        call = begin(img, out, stream)
        key = ("box", method, ksize, anchor, border, value)
        most = (
            _box_band_rows(call.img.shape[-3:], call.img.dtype, ksize, rows)
            if method == "auto"
            else None
        )
        dout = _queue(
            key,
            call,
            call.img.shape,
            lambda src, dst: run(src, ksize, anchor, border, value, dst, call.stream),
            rows,
            border,
            most,
        )
        if method == "auto" and call.from_host:
            _export_box(call.img, ksize)
        return call.finish(dout)

    def again(band):
        return _box_call(band, ksize, anchor, border, value, method, None, stream)

    return _run_or_bands(go, img, out, rows, border, value, again)


def _export_box(dimg, ksize: tuple) -> None:
    """Export the cubins of the box kernel box_auto just ran (both of box_twopass's
    passes), unless it ran box_running."""
    channels, dtype = dimg.shape[2], dimg.dtype
    method, geo = _box.box_choice(dimg, ksize)
    if method == "tiled":
        kernel = _box_tiled.kernel_for(channels, ksize, geo)
        name = cubins.tiled_name(geo, channels, ksize)
        _export(kernel, name, (dtype, np.uint32, dtype, np.uint32))
    elif method == "packed":
        kernel = _box_packed.kernel_for(channels, geo["run"], geo["threads"], geo["even"])
        _export(kernel, cubins.packed_name(geo, channels), (dtype, np.uint32, dtype, np.uint32))
    elif method == "fused":
        kernel = _box_fused.kernel_for(geo["sum_type"], channels, geo["magic_rounding"])
        _export(kernel, cubins.box_name(geo, channels, dtype), (dtype, dtype))
    elif method == "twopass":
        rows, columns = cubins.twopass_names(channels, geo)
        _export(
            _box_twopass.row_kernel_for(channels, geo["run"]), rows, (dtype, np.uint32, np.uint32)
        )
        _export(_box_twopass.column_kernel_for(geo), columns, (np.uint32, dtype))


def contour(img, border, value, method, out=None, stream=None):
    """Fused four-direction contour map; method is ignored (one fused kernel)."""
    if not isinstance(img, np.ndarray):
        options = ("contour", border, value)
        record = _CALLS.get(options)
        if record is None:

            def record(src, dst, handle):
                _contour.contour(src, border, int(value), dst, handle)

            _keep_call(options, record)
        return _on_device(options, img, out, stream, img.shape[:-1], record, (1, 1), border)

    def go():
        call = begin(img, out, stream)
        dimg = call.img
        dout = _queue(
            ("contour", border, value),
            call,
            dimg.shape[:-1],
            lambda src, dst: _contour.contour(src, border, int(value), dst, call.stream),
            (1, 1),
            border,
        )
        if call.from_host:
            name = cubins.contour_name(dimg.shape[2], dimg.dtype)
            _export(_contour.kernel_for(dimg.shape[2]), name, (dimg.dtype,) * 4)
        return call.finish(dout)

    def again(band):
        return contour(band, border, value, method, None, stream)

    return _run_or_bands(go, img, out, (1, 1), border, value, again)
