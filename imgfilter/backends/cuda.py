"""The CUDA backend: runs `kernels` on the GPU (or on Numba's simulator in tests).

Host arrays are copied to the device once and the result copied back; device
arrays (anything with `__cuda_array_interface__`) stay on the device and a Numba
device array is returned. See `imgfilter.backends` for the shared contract.
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda

from kernels import box as _box
from kernels import box_fused as _box_fused
from kernels import box_packed as _box_packed
from kernels import box_tiled as _box_tiled
from kernels import box_twopass as _box_twopass
from kernels import contour as _contour
from kernels import conv as _conv
from kernels import conv_blocked as _blocked
from kernels import conv_plan as _conv_plan
from kernels.conv_plan import low_rank_factors

from ..errors import DeviceError, UsageError
from . import cubins

NAME = "cuda"

# Small images launch small grids; that is expected, not worth a warning to users.
config.CUDA_LOW_OCCUPANCY_WARNINGS = False


def _export(kernel, name: str, array_dtypes: tuple) -> None:
    """Keep the compiled kernel's cubin on disk for the quick start (backends.cached)."""
    if not config.ENABLE_CUDASIM:
        cc = cuda.get_current_device().compute_capability
        cubins.remember(kernel, name, array_dtypes, cc)


def _to_device(img):
    """(device array, came_from_host); the API has already wrapped device inputs."""
    if isinstance(img, np.ndarray):
        return cuda.to_device(np.ascontiguousarray(img)), True
    return img, False


def _finish(out, from_host: bool):
    return out.copy_to_host() if from_host else out


_WEIGHTS: dict = {}
_WEIGHTS_KEEP = 8


def _device_weights(kernel: np.ndarray):
    """The kernel as a float32 device array, kept for reuse: a host-to-device copy
    waits for all queued GPU work, so repeated calls should not make one each time."""
    key = (kernel.shape, kernel.tobytes())
    weights = _WEIGHTS.pop(key, None)
    if weights is None:
        # np.array copies: a broadcast view (stride 0) would not reshape on the device.
        weights = cuda.to_device(np.array(kernel, dtype=np.float32, order="C"))
    _WEIGHTS[key] = weights
    while len(_WEIGHTS) > _WEIGHTS_KEEP:
        _WEIGHTS.pop(next(iter(_WEIGHTS)))
    return weights


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
        return _conv_plan.auto_method(kernel) or ("tiled" if _conv.tiled_fits(kh, kw) else "padded")
    if method == "blocked" and not _conv_plan.fits(kh, kw):
        raise UsageError(
            f"method 'blocked' handles kernels up to {_conv_plan.MAX_SIDE}x{_conv_plan.MAX_SIDE}; "
            "use tiled, padded or naive"
        )
    if method == "tiled" and not _conv.tiled_fits(kh, kw):
        raise UsageError(
            f"method 'tiled' needs {_conv.tiled_smem_bytes(kh, kw)} bytes of shared memory "
            f"for a {kh}x{kw} kernel (limit {_conv.SMEM_LIMIT}); use naive or padded"
        )
    return method


def _run(fn):
    """Call fn(), turning CUDA out-of-memory into DeviceError."""
    try:
        return fn()
    except cuda.cudadrv.driver.CudaAPIError as exc:  # pragma: no cover - real GPU only
        if "OUT_OF_MEMORY" in str(exc) or "2" == str(getattr(exc, "code", "")):
            raise DeviceError(f"the GPU ran out of memory: {exc}") from exc
        raise DeviceError(f"CUDA error: {exc}") from exc


def correlate(img, kernel, anchor, border, value, method):
    """cv2.filter2D semantics on the GPU; see imgfilter.backends."""
    method = _resolve_correlation_method(method, kernel)

    def go():
        dimg, from_host = _to_device(img)
        cval = np.dtype(dimg.dtype).type(value)
        if method == "separable":
            kh, kw = kernel.shape
            terms = [
                (
                    _device_weights(row[None, :]),
                    _device_weights(col[:, None]),
                    float(np.sum(row, dtype=np.float64)),
                )
                for col, row in low_rank_factors(kernel, _conv_plan.max_separable_rank(kh, kw))
            ]
            out = cuda.device_array(dimg.shape, dtype=dimg.dtype)
            _blocked.correlate_low_rank(dimg, terms, anchor, border, cval, out)
        else:
            out = _conv.correlate(dimg, _device_weights(kernel), anchor, border, cval, method)
            if method == "blocked":
                kh, kw = kernel.shape
                name = cubins.blocked_name(kh, kw, dimg.dtype)
                _export(_blocked.kernel_for(kh, kw), name, (dimg.dtype, np.float32, dimg.dtype))
        return _finish(out, from_host)

    return _run(go)


def box(img, ksize, anchor, border, value, method):
    """cv2.blur semantics on the GPU.

    auto: one pass for uint8/uint16 (`kernels.box_tiled` for uint8 boxes up to 41,
    else running sums in `kernels.box_fused` or `kernels.box_packed`), else a column
    running-sum pass then a row pass (cost ~ independent of k for running sums);
    separable: a row-sum pass and a column-sum pass; naive/padded/tiled/blocked: the
    general correlation kernels with a constant kernel of 1 / (kh * kw).
    """
    kh, kw = ksize
    if method in ("auto", "separable"):
        run = _box.box_auto if method == "auto" else _box.box_separable

        def go():
            dimg, from_host = _to_device(img)
            out = run(dimg, ksize, anchor, border, value)
            if method == "auto":
                _export_box(dimg, ksize)
            return _finish(out, from_host)

        return _run(go)
    weights = np.full((kh, kw), 1.0 / (kh * kw), dtype=np.float32)
    return correlate(img, weights, anchor, border, value, method)


def _export_box(dimg, ksize: tuple) -> None:
    """Export the cubins of the box kernel box_auto just ran (both of box_twopass's
    passes), unless it ran box_running."""
    channels, dtype = dimg.shape[2], dimg.dtype
    method, geo = _box.box_choice(dimg, ksize)
    if method == "tiled":
        kernel = _box_tiled.kernel_for(channels, ksize, geo)
        words_out = (np.uint32,) if geo["vertical_first"] else ()
        name = cubins.tiled_name(geo, channels, ksize)
        _export(kernel, name, (dtype, np.uint32, dtype, *words_out))
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


def contour(img, border, value, method):
    """Fused four-direction contour map; method is ignored (one fused kernel)."""

    def go():
        dimg, from_host = _to_device(img)
        out = _contour.contour(dimg, border, int(value))
        channels = dimg.shape[2]
        name = cubins.contour_name(channels, dimg.dtype)
        _export(_contour.kernel_for(channels), name, (dimg.dtype,) * 4)
        return _finish(out, from_host)

    return _run(go)
