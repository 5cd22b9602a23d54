"""The array API: validate arguments, shape images as (H, W, C), call a backend.

NumPy in, NumPy out. GPU arrays (PyTorch CUDA tensors, anything with
`__cuda_array_interface__`: CuPy, Numba; any DLPack producer of CUDA memory: JAX)
are filtered on the GPU without host copies or waiting: the work is queued on the
call's stream and the result comes back at once, of the input's library (a torch
tensor for a torch tensor, a CuPy array for a CuPy array, made by that library's
allocator), else a `kernels.common.devarray.DeviceArray` (which speaks
`__cuda_array_interface__` and DLPack), or the caller's `out` is written.

Every function takes `out=` (an array of the result's shape and dtype, host for host
input, device for device input, not overlapping the input) and `stream=` (a CuPy,
PyTorch, Numba or cuda.core stream, or a CUstream handle). Without `stream`, a call
runs on the stream named by the input's `__cuda_array_interface__` (a torch tensor:
torch's current stream), else on CUDA's legacy default stream.
Semantics match OpenCV: see `filter2d`, `blur` and `contour`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.common import replay
from kernels.common.arrays import as_device_array, is_c_contiguous, is_device_array, overlaps
from kernels.common.cudadrv import CudaError, GpuOutOfMemory
from kernels.common.devarray import DeviceArray, native_empty, stream_handle

from .backends import get_backend
from .border import border_code
from .errors import DeviceError, GpuMemoryError, UsageError
from .names import BLUR_METHODS, CONTOUR_METHODS, FILTER_METHODS, MAX_BOX_SIDE, MAX_KERNEL_SIDE

DTYPES = (np.uint8, np.uint16, np.float32)
_DTYPES = frozenset(np.dtype(t) for t in DTYPES)
CHANNELS = (1, 3, 4)


def _c_contiguous(shape: tuple, strides: tuple, itemsize: int) -> bool:
    """Row-major without gaps; axes of length 1 may have any stride (NumPy's rule)."""
    expected = itemsize
    for n, stride in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1 and stride != expected:
            return False
        expected *= n
    return True


def _as_image(img: Any) -> tuple[Any, bool]:
    """Return (array, is_device) after checking dtype, rank and channel count."""
    kind = type(img)
    device = kind is DeviceArray or (kind is not np.ndarray and is_device_array(img))
    if device:
        try:
            arr = img if kind is DeviceArray else as_device_array(img)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"unusable device array: {exc}") from None
        if type(arr) is DeviceArray and arr.is_c_contiguous and _plain_image(arr.shape, arr.dtype):
            return arr, True  # what a pipeline passes call after call: checked at once
        if not _c_contiguous(arr.shape, arr.strides, arr.dtype.itemsize):
            raise UsageError("device images must be C-contiguous")
    else:
        arr = np.asarray(img)
    if arr.ndim not in (2, 3):
        raise UsageError(f"image must be 2-D (H, W) or 3-D (H, W, C), got shape {arr.shape}")
    if arr.ndim == 3 and arr.shape[2] not in CHANNELS:
        raise UsageError(f"image must have 1, 3 or 4 channels, got {arr.shape[2]}")
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise UsageError(f"image is empty (shape {arr.shape})")
    if arr.dtype not in _DTYPES:
        raise UsageError(
            f"image dtype {np.dtype(arr.dtype)} is not supported; use uint8, uint16 or float32"
        )
    if not device:
        arr = np.ascontiguousarray(arr)
    return arr, device


def _plain_image(shape: tuple, dtype) -> bool:
    """An image _as_image takes as it is: (H, W) or (H, W, C in CHANNELS), not empty,
    of a supported dtype."""
    return (
        (len(shape) == 2 or (len(shape) == 3 and shape[2] in CHANNELS))
        and shape[0] > 0
        and shape[1] > 0
        and dtype in _DTYPES
    )


def _as_3d(arr: Any) -> Any:
    return arr if arr.ndim == 3 else arr.reshape(arr.shape[0], arr.shape[1], 1)


def _check_out(out: Any, arr: Any, device: bool, shape: tuple) -> Any:
    """The caller's `out` as the backend takes it (None stays None): same kind (host
    or device) as the image, the result's shape and dtype, C-contiguous, and sharing
    no memory with the image (filters read neighbours that an in-place write would
    already have changed)."""
    if out is None:
        return None
    if device:
        if isinstance(out, np.ndarray) or not is_device_array(out):
            raise UsageError("out must be a device array for a device image")
        dout = as_device_array(out)
        if not is_c_contiguous(dout):
            raise UsageError("out must be C-contiguous")
        if overlaps(dout, arr):
            raise UsageError("out overlaps the input image; filters cannot run in place")
    else:
        if not isinstance(out, np.ndarray):
            raise UsageError("out must be a NumPy array for a host image")
        dout = out
        if not dout.flags.c_contiguous:
            raise UsageError("out must be C-contiguous")
        if np.shares_memory(dout, arr):
            raise UsageError("out overlaps the input image; filters cannot run in place")
    if tuple(dout.shape) != tuple(shape) or np.dtype(dout.dtype) != np.dtype(arr.dtype):
        raise UsageError(
            f"out must be {np.dtype(arr.dtype)} of shape {tuple(shape)}, "
            f"got {np.dtype(dout.dtype)} {tuple(dout.shape)}"
        )
    return dout


def _out_for(img: Any, out: Any, arr: Any, device: bool, shape: tuple) -> tuple[Any, Any]:
    """(the output as the backend takes it, what the call returns unless None): the
    caller's `out`, checked; for a torch or CuPy image without `out`, a new array of
    that library (results follow the input's type: `native_empty`)."""
    if device and out is None:
        native = native_empty(img, shape, arr.dtype)
        if native is not None:
            return as_device_array(native), native
    return _check_out(out, arr, device, shape), out


def _cast_value(value: float, dtype) -> float:
    """The constant-border value as the image's dtype stores it (cv2.copyMakeBorder rule)."""
    if value == 0:
        return 0.0
    dt = np.dtype(dtype)
    if dt.kind == "u":
        info = np.iinfo(dt)
        return float(min(max(round(float(value)), info.min), info.max))
    return float(np.float32(value))


_MEMO: dict = {}  # validated options by their raw values (bounded)
_MEMO_KEEP = 512


def _remember(key, make):
    """make(), kept under `key` when that is hashable (options repeat call after call;
    checking them again costs more than the lookup)."""
    try:
        return _MEMO[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable option (a list): no memo
        return make()
    value = make()
    if len(_MEMO) >= _MEMO_KEEP:
        _MEMO.clear()
    _MEMO[key] = value
    return value


def _options(anchor, kshape: tuple, border, border_value, method, dtype,
             op: str = "filter2d") -> tuple:  # fmt: skip
    """(anchor (ay, ax), border code, method, border value cast to dtype), checked;
    `method` among operation `op`'s (`_check_method`)."""

    def make():
        return (
            _resolve_anchor(anchor, *kshape),
            border_code(border),
            _check_method(method, op),
            _cast_value(border_value, dtype),
        )

    return _remember(("options", op, anchor, kshape, border, border_value, method, dtype), make)


def _kernel_memo(kernel: Any) -> np.ndarray:
    """as_kernel(kernel), kept by the kernel's bytes (a read-only float32 array)."""
    if isinstance(kernel, np.ndarray) and kernel.size <= MAX_KERNEL_SIDE**2:
        key = ("kernel", kernel.shape, kernel.dtype.str, kernel.tobytes())
    else:
        return as_kernel(kernel)

    def make():
        k = as_kernel(kernel)
        k.flags.writeable = False
        return k

    return _remember(key, make)


def _check_stream(stream: Any) -> Any:
    """The stream as its CUstream handle (None stays None: the input's stream)."""
    if stream is None or type(stream) is int:
        return stream
    try:
        return stream_handle(stream)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _shaped(result: Any, shape: tuple) -> Any:
    return result if result.shape == shape else result.reshape(shape)


def _finish(result: Any, out: Any, shape: tuple, call: tuple | None) -> Any:
    """A filter's return value: `out` when given (the caller's, or the array of the
    input's library `_out_for` made), else the result in the image's shape; filed for
    replays (`replay.remember`) when `call` is the device call's (options, img,
    stream)."""
    result = _shaped(result, shape) if out is None else out
    if call:
        replay.remember(*call, result)
    return result


def _replayed(options: tuple, img: Any, stream: Any) -> Any:
    """`kernels.common.replay.lookup`, its CUDA failures worded as the backend's."""
    try:
        return replay.lookup(options, img, stream)
    except GpuOutOfMemory as exc:
        raise GpuMemoryError(f"{exc}; try --backend cpu") from exc
    except CudaError as exc:
        raise DeviceError(f"CUDA error: {exc}") from exc


def _out_3d(out: Any) -> Any:
    return None if out is None else _as_3d(out)


_METHODS = {"filter2d": FILTER_METHODS, "blur": BLUR_METHODS, "contour": CONTOUR_METHODS}


def _check_method(method: str, op: str) -> str:
    """`method` lower-cased, if it names one of operation `op`'s kernels; else a
    UsageError listing them."""
    method = str(method).lower()
    if method not in _METHODS[op]:
        raise UsageError(f"unknown {op} method {method!r}; choose one of {', '.join(_METHODS[op])}")
    return method


def _resolve_anchor(anchor: tuple[int, int] | None, kh: int, kw: int) -> tuple[int, int]:
    """OpenCV's anchor is (x, y) with -1 meaning the centre; return (ay, ax)."""
    ax, ay = (-1, -1) if anchor is None else anchor
    ax = kw // 2 if ax == -1 else int(ax)
    ay = kh // 2 if ay == -1 else int(ay)
    if not (0 <= ax < kw and 0 <= ay < kh):
        raise UsageError(f"anchor {anchor} lies outside the {kh}x{kw} kernel")
    return ay, ax


def as_kernel(kernel: Any) -> np.ndarray:
    """Check a correlation kernel and return it as a 2-D float32 array.

    A 1-D kernel is a column (N, 1), as OpenCV reads a 1-D NumPy array.
    """
    try:
        k = np.asarray(kernel, dtype=np.float64)
    except (ValueError, TypeError) as exc:
        raise UsageError(
            f"kernel must be a 2-D matrix of numbers (rows of equal length): {exc}"
        ) from None
    if k.ndim == 1:
        k = k.reshape(-1, 1)
    if k.ndim != 2 or k.size == 0:
        raise UsageError(f"kernel must be a non-empty 2-D matrix, got shape {k.shape}")
    if max(k.shape) > MAX_KERNEL_SIDE:
        raise UsageError(
            f"kernel {k.shape[0]}x{k.shape[1]} is too large (sides up to {MAX_KERNEL_SIDE})"
        )
    if not np.isfinite(k).all():
        raise UsageError("kernel contains NaN or infinity")
    return k.astype(np.float32)


_BOX_FORMS = "an int side k, or OpenCV's (width, height) pair of ints"


def _side(value: Any) -> int | None:
    """An int (or integral float) box side as int; None for anything else (bools and
    strings included)."""
    if isinstance(value, bool | np.bool_ | str | bytes):
        return None
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return int(value)
    return None


def box_size(k: int | tuple[int, int]) -> tuple[int, int]:
    """Return (kh, kw) for `k` (a side, or OpenCV's (width, height)); UsageError naming
    the accepted forms for anything else, and for sides below 1 or above MAX_BOX_SIDE."""
    if np.ndim(k) == 0:
        sides = [_side(k)] * 2
    elif np.ndim(k) == 1 and len(k) == 2:
        sides = [_side(s) for s in k]
    else:
        sides = [None]
    if None in sides:
        raise UsageError(f"kernel size must be {_BOX_FORMS}, got {k!r}")
    kw, kh = sides
    for side in (kw, kh):
        if side < 1:
            raise UsageError(f"kernel size must be positive ({_BOX_FORMS}), got {k!r}")
        if side > MAX_BOX_SIDE:
            raise UsageError(f"kernel size {side} is too large (at most {MAX_BOX_SIDE})")
    return kh, kw


def filter2d(
    img: Any,
    kernel: Any,
    *,
    anchor: tuple[int, int] | None = None,
    border: str = "reflect101",
    border_value: float = 0.0,
    backend: str = "auto",
    method: str = "auto",
    out: Any = None,
    stream: Any = None,
    max_gpu_bytes: int | None = None,
) -> Any:
    """Correlate an image with a kernel, equal to `cv2.filter2D(img, -1, kernel, ...)`.

    Every channel (alpha too) is filtered. The kernel is not flipped (correlation, as in
    OpenCV). Integer results are rounded half-to-even and saturated to the dtype.

    Args:
        img: (H, W) or (H, W, C) with C in {1, 3, 4}; uint8, uint16 or float32. A NumPy
            array, or a GPU array (a PyTorch CUDA tensor, anything with
            `__cuda_array_interface__`: CuPy, Numba; C-contiguous), which is filtered on
            the GPU without host copies or waiting.
        kernel: Any 2-D shape up to 255x255 of finite numbers (used as float32), not
            flipped. A 1-D kernel is a column (N, 1), as OpenCV reads a 1-D NumPy array.
        anchor: OpenCV's (x, y); default (None, or -1 for a coordinate) the centre
            (kw//2, kh//2).
        border: "reflect101" (default, OpenCV's), "reflect", "replicate", "constant"
            (`border_value`) or "wrap".
        border_value: The value outside the image for border "constant", as the image's
            dtype stores it (integers: rounded and saturated; the `cv2.copyMakeBorder`
            rule).
        backend: "cuda" (Numba CUDA kernels), "cpu" (Numba parallel CPU) or "auto"
            (cuda when a usable GPU exists). Device images need the cuda backend.
        method: The CUDA variant: "auto", "naive", "padded", "tiled", "window" (any
            kernel size up to 61x61, each thread a column of outputs from registers),
            "blocked" (register-blocked tiles, compiled for each kernel size, up to
            31x31) or "separable" (a kernel of low rank as one pair of
            1-D passes per term: rank 1, an outer product, or a sum of up to
            (kh * kw - 1) // (kh + kw) of them).
        out: An array of the result's shape and dtype to write into: host for a host
            image, device for a device image, C-contiguous, not overlapping the input
            (filters cannot run in place).
        stream: A CuPy, PyTorch, Numba or cuda.core stream, or a CUstream handle.
            Without it, a call runs on the stream named by the input's
            `__cuda_array_interface__` (a torch tensor: torch's current stream), else on
            CUDA's legacy default stream.
        max_gpu_bytes: Device memory a host image's filter may take on the GPU; an image
            that needs more is filtered in row bands streamed through it
            (`imgfilter.streamed`), with the same result. By default a host image of
            32 MiB or more (`BANDS_MIN_BYTES`) goes in bands, using up to 80% of the
            GPU's free memory: faster than in one piece (its copies page-locked and
            overlapping the filtering); a large `max_gpu_bytes` sends it in one piece.

    Returns:
        An array of img's shape and dtype; `out` when given. NumPy in, NumPy out. For a
        device image, the work is queued on the call's stream and the result comes
        back at once: a torch tensor for a torch tensor, a CuPy array for a CuPy
        array (made by that library, on its current stream: with another `stream`,
        keep it alive until that stream's work is done), else a
        `kernels.common.devarray.DeviceArray` (`__cuda_array_interface__` and DLPack).

    Raises:
        UsageError: An unsupported image (rank, channel count, dtype, empty, a device
            image that is not C-contiguous), kernel (not 2-D, larger than 255x255, NaN
            or infinity), anchor outside the kernel, border, method, backend, `out`,
            `stream` or `max_gpu_bytes`.
        DeviceError: Backend "cuda" without a usable GPU; `GpuMemoryError` when the GPU
            cannot give the memory the call needs.

    Example:
        >>> import numpy as np
        >>> import imgfilter
        >>> img = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
        >>> sharpen = [[0, -1, 0], [-1, 5, -1], [0, -1, 0]]
        >>> out = imgfilter.filter2d(img, sharpen, border="replicate")
        >>> out.shape, out.dtype
        ((4, 4, 3), dtype('uint8'))
    """
    if out is None:
        kkey = (
            (kernel.shape, kernel.dtype.str, kernel.tobytes())
            if type(kernel) is np.ndarray
            else kernel
        )
        options = ("filter2d", kkey, anchor, border, border_value, backend, method, max_gpu_bytes)
        if (replayed := _replayed(options, img, stream)) is not None:
            return replayed
    arr, device = _as_image(img)
    k = _kernel_memo(kernel)
    anchor_yx, code, method, value = _options(anchor, k.shape, border, border_value, method,
                                              arr.dtype)  # fmt: skip
    given = out
    dout, out = _out_for(img, out, arr, device, arr.shape)
    be = get_backend(backend, device_input=device)
    stream = _check_stream(stream)
    reach = (anchor_yx[0], k.shape[0] - 1 - anchor_yx[0])

    def run(src, dst, handle):
        return be.correlate(src, k, anchor_yx, code, value, method, dst, handle)

    if not device and (budget := _band_budget(be, arr, arr.nbytes, max_gpu_bytes)):
        return _in_bands(be, arr, out, arr.shape, reach, code, run, budget)
    result = run(_as_3d(arr), _out_3d(dout), stream)
    call = (options, img, stream) if device and given is None else None
    return _finish(result, out, arr.shape, call)


def blur(
    img: Any,
    k: int | tuple[int, int],
    *,
    anchor: tuple[int, int] | None = None,
    border: str = "reflect101",
    border_value: float = 0.0,
    backend: str = "auto",
    method: str = "auto",
    out: Any = None,
    stream: Any = None,
    max_gpu_bytes: int | None = None,
) -> Any:
    """Normalized box filter, equal to `cv2.blur(img, (k, k))`.

    Each output is the mean of the box of pixels around it.

    Args:
        img: The image, as for `filter2d`: (H, W) or (H, W, C), C in {1, 3, 4}, uint8,
            uint16 or float32, host or device.
        k: The side of the square box, or OpenCV's (width, height); even sizes are valid
            (anchor at (k//2, k//2) as in OpenCV). Sides up to 4095.
        anchor: OpenCV's (x, y); default the centre, as in `filter2d`.
        border: As `filter2d`: reflect101 (default), reflect, replicate, constant
            (`border_value`), wrap.
        border_value: The value outside the image for border "constant".
        backend: "auto", "cuda" or "cpu", as `filter2d`.
        method: As `filter2d`; "auto" uses separable running sums on the GPU.
        out: As `filter2d`: an array of the result's shape and dtype, host for host
            input, device for device input, not overlapping the input.
        stream: As `filter2d` (default: the input's stream, else CUDA's legacy default
            stream).
        max_gpu_bytes: As `filter2d`: a host image needing more device memory (by
            default: one of 32 MiB or more) is filtered in row bands streamed through
            the GPU, with the same result.

    Returns:
        An array of img's shape and dtype (for a device image, queued on the stream, of
        the image's library as in `filter2d`); `out` when given.

    Raises:
        UsageError: A kernel size that is not a positive integer or is larger than 4095,
            or any image or option `filter2d` refuses.
        DeviceError: Backend "cuda" without a usable GPU (`GpuMemoryError` when the GPU
            cannot give the memory the call needs).

    Example:
        >>> import numpy as np
        >>> import imgfilter
        >>> img = np.full((8, 8), 100, np.uint8)
        >>> imgfilter.blur(img, 3)[0, :3]
        array([100, 100, 100], dtype=uint8)
        >>> wide = imgfilter.blur(img, (5, 1))  # 5 wide, 1 high: a horizontal box
    """
    if out is None:
        options = ("blur", k, anchor, border, border_value, backend, method, max_gpu_bytes)
        if (replayed := _replayed(options, img, stream)) is not None:
            return replayed
    arr, device = _as_image(img)
    ksize, anchor_yx, code, method, value = _box_options(k, anchor, border, border_value,
                                                         method, arr.dtype)  # fmt: skip
    given = out
    dout, out = _out_for(img, out, arr, device, arr.shape)
    be = get_backend(backend, device_input=device)
    stream = _check_stream(stream)
    reach = (anchor_yx[0], ksize[0] - 1 - anchor_yx[0])

    def run(src, dst, handle):
        return be.box(src, ksize, anchor_yx, code, value, method, dst, handle)

    if not device and (budget := _band_budget(be, arr, arr.nbytes, max_gpu_bytes)):
        return _in_bands(be, arr, out, arr.shape, reach, code, run, budget)
    result = run(_as_3d(arr), _out_3d(dout), stream)
    call = (options, img, stream) if device and given is None else None
    return _finish(result, out, arr.shape, call)


def _box_options(k, anchor, border, border_value, method, dtype) -> tuple:
    """(ksize (kh, kw), anchor (ay, ax), border code, method, border value), checked,
    kept by the raw options (one lookup per call)."""

    def make():
        ksize = box_size(k)
        return (ksize, *_options(anchor, ksize, border, border_value, method, dtype, "blur"))

    # type(k): True == 1 and hashes as 1, but is no kernel size
    return _remember(("blur", k, type(k), anchor, border, border_value, method, dtype), make)


def contour(
    img: Any,
    *,
    border: str = "reflect101",
    border_value: float = 0.0,
    backend: str = "auto",
    method: str = "auto",
    out: Any = None,
    stream: Any = None,
    max_gpu_bytes: int | None = None,
) -> Any:
    """Four-direction edge map, OR-merged.

    Colour input is converted to gray as `cv2.cvtColor(BGR2GRAY / BGRA2GRAY)`. The
    kernels [[-1,0,1]]*3, its negation, [[-1,-1,-1],[0,0,0],[1,1,1]] and its negation
    are applied (3x3, centre anchor, `border`), each response saturated to the dtype,
    and the four OR-ed bitwise: bit-exact with four cv2.filter2D calls and
    cv2.bitwise_or.

    Args:
        img: (H, W) or (H, W, C), C in {1, 3, 4}, host or device. Integer images only
            (uint8, uint16).
        border: As `filter2d` (reflect101 by default).
        border_value: The value outside the image for border "constant".
        backend: "auto", "cuda" or "cpu", as `filter2d`.
        method: The CUDA variant, as `filter2d`.
        out: (H, W) of img's dtype; the kind and overlap rules of `filter2d`.
        stream: See `filter2d`.
        max_gpu_bytes: See `filter2d`.

    Returns:
        (H, W) of img's dtype (for a device image, queued on the stream, of the image's
        library as in `filter2d`); `out` when given.

    Raises:
        UsageError: A float32 image, or any image or option `filter2d` refuses.
        DeviceError: Backend "cuda" without a usable GPU (`GpuMemoryError` when the GPU
            cannot give the memory the call needs).

    Example:
        >>> import numpy as np
        >>> import imgfilter
        >>> img = np.zeros((6, 6), np.uint8)
        >>> img[:, 3:] = 200
        >>> edges = imgfilter.contour(img)
        >>> edges[0]
        array([  0,   0, 255, 255,   0,   0], dtype=uint8)
    """
    if out is None:
        options = ("contour", border, border_value, backend, method, max_gpu_bytes)
        if (replayed := _replayed(options, img, stream)) is not None:
            return replayed
    arr, device = _as_image(img)
    if np.dtype(arr.dtype) == np.float32:
        raise UsageError("contour needs an integer image (uint8 or uint16), got float32")
    code, method, value = _remember(
        ("contour", border, method, border_value, arr.dtype),
        lambda: (
            border_code(border),
            _check_method(method, "contour"),
            _cast_value(border_value, arr.dtype),
        ),
    )
    given = out
    dout, out = _out_for(img, out, arr, device, arr.shape[:2])
    be = get_backend(backend, device_input=device)
    stream = _check_stream(stream)

    def run(src, dst, handle):
        return be.contour(src, code, value, method, dst, handle)

    out_bytes = arr.shape[0] * arr.shape[1] * arr.dtype.itemsize
    if not device and (budget := _band_budget(be, arr, out_bytes, max_gpu_bytes)):
        return _in_bands(be, arr, out, arr.shape[:2], (1, 1), code, run, budget, gray=True)
    result = run(_as_3d(arr), dout, stream)
    call = (options, img, stream) if device and given is None else None
    return _finish(result, out, arr.shape[:2], call)


def set_gpu_pool_limit(nbytes: int) -> None:
    """Bound the GPU memory imgfilter's device pool holds.

    Device results and scratch come from a caching pool (freed blocks are kept for
    later calls of the same sizes, on the same stream). When a call needs a new block
    while the pool holds more than `nbytes` (in use and cached), the cached blocks go
    back to CUDA first, waiting for the device once. Default: 4 GiB, or the
    IMGFILTER_GPU_POOL_BYTES environment variable. 0 caches nothing past the arrays
    in use whenever a new block is needed.

    Raises:
        UsageError: `nbytes` is not an int >= 0.
    """
    from kernels.common.devarray import set_pool_limit

    try:
        set_pool_limit(nbytes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# ------------------------------------------------- images larger than the GPU

# Host images of this many bytes or more go through the GPU in row bands by default
# (`imgfilter.streamed`: page-locked copies overlapping the filtering) even where they
# fit whole: an H100 blurred 50 MB of uint8 in under half the time that way, 0.2-0.8 GB
# in a quarter. Smaller images go whole, where pageable copies are quicker to set up.
BANDS_MIN_BYTES = 32 << 20


def _band_budget(be, arr: np.ndarray, out_bytes: int, max_gpu_bytes: int | None) -> int:
    """Device bytes for filtering host image `arr` in row bands on the CUDA backend,
    or 0 when it goes whole: it needs no more than max_gpu_bytes, or (by default) it
    takes less than BANDS_MIN_BYTES. By default the bands may take 80% of the GPU's
    free memory."""
    if max_gpu_bytes is not None and (isinstance(max_gpu_bytes, bool) or max_gpu_bytes < 1):
        raise UsageError(f"max_gpu_bytes must be a positive number of bytes, got {max_gpu_bytes}")
    if getattr(be, "NAME", None) != "cuda":
        return 0
    from .streamed import SCRATCH_PER_BYTE

    need = arr.nbytes * (1 + SCRATCH_PER_BYTE) + out_bytes
    if max_gpu_bytes is not None:
        return int(max_gpu_bytes) if need > max_gpu_bytes else 0
    if arr.nbytes < BANDS_MIN_BYTES:
        return 0
    from kernels.common.arrays import SIMULATOR

    if SIMULATOR:
        return 0
    from kernels.common.cudadrv import driver

    return max(1, int(driver().free_and_total()[0] * 0.8))


def _in_bands(be, arr: np.ndarray, out: Any, shape: tuple, reach: tuple, code: int, run,
              budget: int, gray: bool = False) -> np.ndarray:  # fmt: skip
    """`run(src, dst, stream)` (a call of backend `be`) over host `arr` in row bands
    into `out` (or a new array of `shape`): `imgfilter.streamed.filter_in_bands`. The
    bands of dst are (H, W, C) as the backend's filters take them, or (H, W) for
    `gray` results (contour)."""
    from kernels.common.border_index import WRAP

    from .hostmem import host_empty
    from .streamed import filter_in_bands

    result = host_empty(shape, arr.dtype) if out is None else out
    dst = result if gray else _as_3d(result)
    filter_in_bands(_as_3d(arr), dst, reach, code == WRAP, run, budget)
    return result
