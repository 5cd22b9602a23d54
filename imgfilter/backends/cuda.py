"""The CUDA backend: runs `kernels` on the GPU (or on Numba's simulator in tests).

Host arrays are copied to the device and the result copied back (the call waits for
it); device arrays (the API hands them over as `kernels.common.devarray.DeviceArray` views)
stay on the device: the work is queued on the call's stream and a device array is
returned at once, without waiting for the GPU. See `imgfilter.backends` for the
shared contract.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from kernels.box import dispatch as _box
from kernels.common import replay
from kernels.common.arrays import (
    copy_rows,
    empty,
    empty_like,
    resolve_stream,
    to_device,
    to_host,
)
from kernels.common.batching import Batching
from kernels.common.border_index import WRAP
from kernels.common.border_index import border_index as _border_index
from kernels.common.cudadrv import CudaError, GpuOutOfMemory, NoMemoryForContext
from kernels.common.launch import (
    NotCompiled,
    Recording,
    checking,
    compile_lock,
)
from kernels.contour import launch as _contour
from kernels.conv import dispatch as _conv
from kernels.conv import launch as _conv_launch
from kernels.conv import plan as _conv_plan

from ..errors import DeviceError, GpuMemoryError, UsageError
from . import background

NAME = "cuda"
PER_THREAD_STREAM = 2  # CU_STREAM_PER_THREAD: the calling thread's own default stream
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"  # read once, as Numba does


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


def _queue(key: tuple, call: _Call, out_shape: tuple, run, rows: tuple = (0, 0), border: int = 0,
           band_rows: int | None = None, keep: bool = True):  # fmt: skip
    """`_on_device` for a call's device image (a host image once uploaded, or one of
    a batch's): `run(img, out)` queued on the call's stream into the call's out, or a
    new array of `out_shape`, which is returned."""
    return _on_device(key, call.img, call.out, call.stream, out_shape,
                      lambda src, dst, handle: run(src, dst), rows, border, band_rows,
                      keep)  # fmt: skip


def _queue_batch(key: tuple, batch, out, stream: int, run):
    """`_queue` for a batch: the launches of its first image made for every image
    (`kernels.common.batching.Batching`: one launch per kernel where it can), recorded and
    replayed as one recipe; each image on its own where the images do not keep the
    first one's 16-byte alignment."""
    n = batch.shape[0]
    step_in, step_out = batch.strides[0], out.strides[0]
    if step_in % 16 or step_out % 16:
        for i in range(n):
            _queue(key, _Call(batch[i], stream, False, None, out[i]), out.shape[1:], run)
        return out
    batching = Batching(n, ((batch[0], step_in), (out[0], step_out)))
    if SIMULATOR:
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
    key = ("recipe", key, img.shape, img.dtype.num, img.ptr & 15, out.ptr & 15, stream)
    recipe = replay.TABLE.get(key)
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
        replay.keep(key, recipe)
    return recipe


def _on_device(key: tuple, img, out, stream, out_shape: tuple, record, rows: tuple,
               border: int, band_rows: int | None = None, keep: bool = True):  # fmt: skip
    """A device image's call: queued on its stream (`kernels.common.arrays.resolve_stream`)
    into `out` (allocated there when None), which is returned at once. `record(src,
    dst, handle)` makes the launches: on a first call of its key, shapes, alignments
    and stream, recorded (`kernels.common.launch.Recording`); later calls replay them, a few
    microseconds of Python. `key` holds every option that shapes the launches
    besides the arrays (kernel size, anchor, border, value, method...). `rows` =
    (above, below): the rows of neighbours an output row reads, and `border` the
    vertical border rule, for images filtered in bands of at most `band_rows` rows
    (`_in_row_bands`; default MAX_GRID_ROWS, the rows one grid covers). keep=False: a
    stand-in while a kernel compiles, run as it is (neither recorded nor replayed, so
    the next call looks for the compiled kernel again). CUDA failures as `_run` says."""
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
        if not keep:
            images = [(img, out)] if ndim == 3 else [(img[i], out[i]) for i in range(len(img))]
            for one, dst in images:
                record(one, dst, handle)
            return out
        if ndim == 4:
            return _queue_batch(key, img, out, handle, lambda s, d: record(s, d, handle))
        if SIMULATOR:
            with compile_lock:  # the simulator swaps the kernel modules' globals meanwhile
                record(img, out, handle)
            return out
        recipe = replay.TABLE.get(
            ("recipe", key, img.shape, img.dtype.num, img.ptr & 15, out.ptr & 15, handle)
        )
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


def _box_band_rows(shape: tuple, dtype, ksize: tuple, rows: tuple) -> int:
    """Rows per band for box auto (`kernels.box.dispatch.band_rows`), else MAX_GRID_ROWS."""
    return _box.band_rows(shape, dtype, ksize, rows, MAX_GRID_ROWS) or MAX_GRID_ROWS


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
        if SIMULATOR:
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


def _prepared(shape: tuple, data: bytes, method: str) -> tuple[str, tuple]:
    """`kernels.conv.dispatch.prepared`, a refused method as a UsageError."""
    try:
        return _conv.prepared(shape, data, method)
    except _conv.MethodRefused as exc:
        raise UsageError(str(exc)) from None


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
        _conv_launch.correlate_low_rank(src, dterms, anchor, border, cval, dst, handle)
    else:
        weights = _device_weights(kernel, handle)
        _conv.correlate(src, weights, anchor, border, cval, method, dst, handle)


# ------------------------------------------------------- first use of a kernel
#
# Some kernels are specialised for a size (the uint8 box kernels auto picks for a box
# size, the register-blocked correlation for a kernel size) and do not ship; Numba
# compiles them in 3-10 s. Until one is compiled, its call runs a size-generic kernel
# that ships (the same results) and a detached process compiles it into the kernel
# cache (`imgfilter.backends.background`: a process, not a thread, whose compile
# would hold the GIL and slow the caller's every call meanwhile); later calls load it
# from there. The op's planner names the stand-in; whether a compile is needed is
# learned by running the launch function under `kernels.common.launch.checking`.
# IMGFILTER_BACKGROUND_COMPILE=0: compile at once.
_READY: set = set()  # calls whose launches need no compile
_PENDING: dict = {}  # call -> when its kernels' binaries were last looked for
_LOOK_EVERY_S = 0.5


def _compiling(call: tuple, launches, compile_code) -> bool:
    """Whether `launches()` (a launch function on the call's device image) needs a
    kernel that a detached process is compiling now: started here on the first look
    (`compile_code(name)`: the Python source that compiles kernel `name`). False where
    nothing needs compiling, or where no background compile can start (the caller then
    compiles at once). A call looks again at most every _LOOK_EVERY_S."""
    if SIMULATOR or not background.ENABLED or call in _READY:
        return False
    now = time.monotonic()
    last = _PENDING.get(call)
    if last is not None and now - last < _LOOK_EVERY_S:
        return True
    try:
        with checking():
            launches()
    except NotCompiled as exc:
        if last is None and (
            exc.name is None or not background.start(exc.name, compile_code(exc.name))
        ):
            return False
        _PENDING[call] = now
        return True
    _READY.add(call)
    _PENDING.pop(call, None)
    return False


def _box_now(img, ksize: tuple, anchor, border: int, value, out=None) -> str:
    """Method auto, or its stand-in (`kernels.box.dispatch.stand_in`) while the kernel
    auto picks for this device image and box is compiled in the background."""
    chosen = _box.stand_in(img, ksize, out)
    if chosen is None:
        return "auto"
    method, stand_in = chosen
    one = img if len(img.shape) == 3 else img[0]
    shape = tuple(one.shape)
    call = ("box", method, shape, one.dtype.num, ksize)

    def launches():
        _box.box_auto(one, ksize, anchor, border, value, None, PER_THREAD_STREAM)

    def code(name: str) -> str:
        args = f"{name!r}, {shape!r}, {one.dtype.name!r}, {tuple(ksize)!r}"
        return f"import imgfilter.backends.cuda as c; c.compile_box({args})"

    return stand_in if _compiling(call, launches, code) else "auto"


def _blocked_or_window(kh: int, kw: int, dtype) -> str:
    """ "blocked" when its kernel for this size and dtype can run now, else "window"
    (the same results, any size) while a detached process compiles it."""
    if not _conv_plan.window_fits(kh, kw):
        return "blocked"
    name = _dtype_name(dtype)

    def launches():
        img = empty((8, 8, 1), np.dtype(dtype), PER_THREAD_STREAM)
        weights = _device_weights(np.ones((kh, kw), np.float32), PER_THREAD_STREAM)
        cval = np.dtype(dtype).type(0)
        _conv.correlate(img, weights, (0, 0), 0, cval, "blocked", img, PER_THREAD_STREAM)

    def code(binary: str) -> str:
        return ("import imgfilter.backends.cuda as c; "
                f"c.compile_blocked({binary!r}, {kh}, {kw}, {name!r})")  # fmt: skip

    return "window" if _compiling(("blocked", kh, kw, name), launches, code) else "blocked"


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    """np.dtype(dtype).name, kept (NumPy derives the name anew each time)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return name


def compile_box(name: str, shape: tuple, dtype: str, ksize: tuple) -> None:
    """In a detached process (`_box_now`): blur a zero image of this shape, which
    compiles box kernel `name` (and the others auto runs) into the kernel cache, then
    remove its marker. Never raises."""
    background.ENABLED = False
    with background.compiling(name):
        kh, kw = ksize
        box(np.zeros(shape, dtype), ksize, (kh // 2, kw // 2), 0, 0.0, "auto")


def compile_blocked(name: str, kh: int, kw: int, dtype: str) -> None:
    """In a detached process (`_blocked_or_window`): run the register-blocked kernel for
    a kh x kw kernel on a small `dtype` image, which compiles it (binary `name`) into
    the kernel cache, then remove its marker. Never raises."""
    background.ENABLED = False
    with background.compiling(name):
        img = np.ones((8, 8, 1), dtype)
        correlate(img, np.ones((kh, kw), np.float32), (0, 0), 0, 0.0, "blocked")


# A device call's (key, record, rows) for `_on_device`, by its options: made once
# (closures and key tuples cost more than the lookup), at most _CALLS_KEEP of them.
_CALLS: dict = {}
_CALLS_KEEP = 512


def _keep_call(options: tuple, call: tuple) -> tuple:
    if len(_CALLS) >= _CALLS_KEEP:
        _CALLS.clear()
    _CALLS[options] = call
    return call


def _correlate_call(kernel: np.ndarray, data: bytes, anchor, border, value, method):
    """(key, record, rows) of a device correlation, which compiles what it needs at
    once (see `_box_call`). The closure keeps the kernel as read-only bytes: a caller's
    array may change."""
    kernel = np.frombuffer(data, dtype=np.float32).reshape(kernel.shape)
    method, terms = _prepared(kernel.shape, data, method)
    key = ("correlate", method, kernel.shape, data, anchor, border, value)

    def record(src, dst, handle):
        _correlate_launches(src, dst, handle, kernel, terms, anchor, border, value, method)

    return key, record, (anchor[0], kernel.shape[0] - 1 - anchor[0])


def correlate(img, kernel, anchor, border, value, method, out=None, stream=None):
    """cv2.filter2D semantics on the GPU; see imgfilter.backends."""
    kernel = np.ascontiguousarray(kernel, dtype=np.float32)
    data = kernel.tobytes()
    if not isinstance(img, np.ndarray):
        options = ("correlate", data, kernel.shape, anchor, border, value, method)
        call = _CALLS.get(options)
        if call is None:
            call = _keep_call(options, _correlate_call(kernel, data, anchor, border, value, method))
        key, record, rows = call
        return _on_device(key, img, out, stream, img.shape, record, rows, border)
    requested = method
    method, terms = _prepared(kernel.shape, data, method)
    final = True
    if requested == "auto" and method == "blocked" and background.ENABLED:
        if not SIMULATOR:  # the simulator compiles nothing
            method = _blocked_or_window(*kernel.shape, img.dtype)
            final = method == "blocked"

    def go():
        call = begin(img, out, stream)
        dimg, handle = call.img, call.stream
        key = ("correlate", method, kernel.shape, data, anchor, border, value)

        def run(src, dst):
            _correlate_launches(src, dst, handle, kernel, terms, anchor, border, value, method)

        rows = (anchor[0], kernel.shape[0] - 1 - anchor[0])
        dout = _queue(key, call, dimg.shape, run, rows, border, None, final)
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
    rows = (anchor[0], kh - 1 - anchor[0])
    if not isinstance(img, np.ndarray):
        # Device images compile what they need at once: a stand-in would have the call
        # that finds the compiled kernel load its module, which waits for the device.
        options = ("box", method, ksize, anchor, border, value)
        call = _CALLS.get(options)
        if call is None:
            call = _keep_call(options, _box_record(method, ksize, anchor, border, value, rows))
        key, record, rows = call
        most = _box_band_rows(img.shape[-3:], img.dtype, ksize, rows) if method == "auto" else None
        return _on_device(key, img, out, stream, img.shape, record, rows, border, most)

    def go():
        call = begin(img, out, stream)
        now = method
        if method == "auto" and not SIMULATOR and background.ENABLED:
            now = _box_now(call.img, ksize, anchor, border, value, call.out)
        key, record, _ = _box_record(now, ksize, anchor, border, value, rows)
        shape = call.img.shape[-3:]
        most = _box_band_rows(shape, call.img.dtype, ksize, rows) if now == "auto" else None
        run = lambda src, dst: record(src, dst, call.stream)  # noqa: E731
        dout = _queue(key, call, call.img.shape, run, rows, border, most, now == method)
        return call.finish(dout)

    def again(band):
        return _box_call(band, ksize, anchor, border, value, method, None, stream)

    return _run_or_bands(go, img, out, rows, border, value, again)


def _box_record(method: str, ksize, anchor, border, value, rows: tuple) -> tuple:
    """(key, record, rows) of a box call by `method` for `_on_device`."""
    run = _box.box_by_name(method)

    def record(src, dst, handle):
        run(src, ksize, anchor, border, value, dst, handle)

    return ("box", method, ksize, anchor, border, value), record, rows


def filter_op(options: tuple, record, img, out, stream, rows: tuple, border: int, value,
              again, out_shape=None):  # fmt: skip
    """One call of a neighbourhood operation on the GPU, for an operation's backend code:
    a device image queued on its stream (`_on_device`), a host image uploaded, filtered
    and downloaded (in bands of rows when the GPU lacks the memory). `options`: hashable,
    every option that shapes the launches; `record(src, dst, handle)` queues them on
    device arrays; `rows` = (above, below) rows an output row reads and `border` the
    vertical border rule (and `value` its constant); `again(band)` filters one host
    band the same way; `out_shape(shape)` the result's shape (default: the image's)."""
    shape_of = out_shape or (lambda shape: shape)
    if not isinstance(img, np.ndarray):
        return _on_device(options, img, out, stream, shape_of(img.shape), record, rows, border)

    def go():
        call = begin(img, out, stream)
        run = lambda src, dst: record(src, dst, call.stream)  # noqa: E731
        return call.finish(_queue(options, call, shape_of(call.img.shape), run, rows, border))

    return _run_or_bands(go, img, out, rows, border, value, again)


def contour(img, border, value, method, out=None, stream=None):
    """Fused four-direction contour map; method is ignored (one fused kernel)."""
    options = ("contour", border, value)
    record = _CALLS.get(options)
    if record is None:

        def record(src, dst, handle):
            _contour.contour(src, border, int(value), dst, handle)

        _keep_call(options, record)

    def again(band):
        return contour(band, border, value, method, None, stream)

    return filter_op(options, record, img, out, stream, (1, 1), border, value, again,
                     lambda shape: shape[:-1])  # fmt: skip
