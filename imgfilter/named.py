"""Named filters from correlation kernels, each equal to its OpenCV function: `gaussian`,
`sobel`, `scharr`, `laplacian`, `gradient_magnitude` and `sharpen`.

Each is a `filter2d` call with the kernel OpenCV uses (two for `gradient_magnitude`),
so the backends, host and device images, `out=`, `stream=`, every border and the row
bands of huge images are filter2d's: each takes filter2d's keyword options (border,
border_value, backend, method, out, stream, max_gpu_bytes). Where the result's dtype
is not the image's (`ddepth`) or `delta` is not 0, a host image is filtered as a
float32 copy and the sums converted as OpenCV's `saturate_cast` does (rounded half to
even, saturated); device images take the cases that are one `filter2d` call.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from .api import _as_image, filter2d
from .errors import UsageError
from .names import MAX_KERNEL_SIDE

__all__ = ["gaussian", "gaussian_kernel", "gradient_magnitude", "laplacian", "scharr",
           "sharpen", "sobel"]  # fmt: skip

# Result dtypes `ddepth` may name: OpenCV's CV_8U, CV_16U, CV_16S, CV_32F, CV_64F.
DDEPTHS = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.int16, np.float32, np.float64))
_FLOAT32_EXACT = 1 << 24  # float32 holds every integer below it
# Fraction bits of OpenCV's fixed-point GaussianBlur kernels (ufixedpoint16, ufixedpoint32).
_FIXED_BITS = {np.dtype(np.uint8): 8, np.dtype(np.uint16): 16}


def _number(value: Any, name: str) -> float:
    """`value` as a finite float; UsageError naming `name` otherwise."""
    if isinstance(value, bool | np.bool_ | str | bytes):
        raise UsageError(f"{name} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise UsageError(f"{name} must be finite, got {value!r}")
    return number


def _integer(value: Any, name: str) -> int:
    """`value` as an int (integral floats too); UsageError naming `name` otherwise."""
    number = _number(value, name)
    if not number.is_integer():
        raise UsageError(f"{name} must be an integer, got {value!r}")
    return int(number)


# --------------------------------------------------------------------------- Gaussian


def _fixed_point(k: np.ndarray, bits: int) -> np.ndarray:
    """OpenCV's fixed-point copy of a symmetric odd kernel (`getGaussianKernelFixedPoint_ED`):
    each outer tap rounded to `bits` fraction bits (half to even) with the rounding
    error carried to the next, the centre making the sum exactly 1."""
    n, scale = len(k), float(1 << bits)
    fixed, err, total = np.zeros(n), 0.0, 0
    for i in range(n // 2):
        adjusted = float(k[i]) * scale + err
        v = round(adjusted)
        err = adjusted - v
        fixed[i] = fixed[n - 1 - i] = v
        total += v
    fixed[n // 2] = (1 << bits) - 2 * total
    return fixed / scale


def _side(value: Any) -> int:
    side = _integer(value, "ksize")
    if side < 0 or (side and side % 2 == 0) or side > MAX_KERNEL_SIDE:
        raise UsageError(f"ksize sides must be odd, 1 to 255, or 0 (from sigma), got {value!r}")
    return side


@functools.lru_cache(maxsize=256)
def _gaussian_cached(kw: int, kh: int, sx: float, sy: float, dtype: np.dtype) -> np.ndarray:
    import cv2

    reach = 3 if dtype == np.uint8 else 4  # OpenCV: 3 sigma each side for 8-bit, else 4
    bits, ks = _FIXED_BITS.get(dtype), []
    for side, sigma, name in ((kw, sx, "sigma_x"), (kh, sy if sy > 0 else sx, "sigma_y")):
        if side == 0:
            if sigma <= 0:
                raise UsageError(f"ksize 0 takes its size from {name}, which must be > 0")
            side = round(sigma * reach * 2 + 1) | 1  # cvRound: half to even, as round()
            if side > MAX_KERNEL_SIDE:
                raise UsageError(f"sigma {sigma:g} needs a {side}-tap kernel; at most 255")
        k = cv2.getGaussianKernel(side, max(sigma, 0.0), cv2.CV_64F).ravel()
        ks.append(_fixed_point(k, bits) if bits else k.astype(np.float32).astype(np.float64))
    kernel = np.outer(ks[1], ks[0]).astype(np.float32)
    kernel.flags.writeable = False
    return kernel


def gaussian_kernel(
    ksize: int | tuple[int, int], sigma_x: float, sigma_y: float = 0.0, dtype: Any = np.float32
) -> np.ndarray:
    """The (kh, kw) float32 kernel `gaussian` correlates an image of `dtype` with.

    `np.outer(ky, kx)` of the 1-D kernels `cv2.GaussianBlur` uses: `cv2.getGaussianKernel`
    of each side and sigma, for uint8 and uint16 its fixed-point copy (8 and 16 fraction
    bits, summing to exactly 1), as OpenCV computes with. `ksize` is an odd int
    (square) or (width, height); a side of 0 comes from its sigma, `round(sigma * 2 * r
    + 1) | 1` with r = 3 for uint8 and 4 otherwise. `sigma_y` 0 means `sigma_x`; a
    sigma <= 0 with a given side is OpenCV's default for it.

    Raises:
        UsageError: A side even, negative or above 255, or 0 without a positive sigma;
            a sigma not a finite number; a dtype other than uint8, uint16, float32.
    """
    if np.ndim(ksize) == 0:
        kw = kh = _side(ksize)
    elif np.ndim(ksize) == 1 and len(ksize) == 2:
        kw, kh = (_side(s) for s in ksize)
    else:
        raise UsageError(f"ksize must be an int or OpenCV's (width, height), got {ksize!r}")
    dt = np.dtype(dtype)
    if dt not in (np.uint8, np.uint16, np.float32):
        raise UsageError(f"dtype {dt} is not supported; use uint8, uint16 or float32")
    sx, sy = _number(sigma_x, "sigma_x"), _number(sigma_y, "sigma_y")
    return _gaussian_cached(kw, kh, sx, sy, dt)


def gaussian(img: Any, ksize: int | tuple[int, int], sigma_x: float, sigma_y: float = 0.0,
             **options: Any) -> Any:  # fmt: skip
    """Gaussian blur, equal to `cv2.GaussianBlur(img, ksize, sigma_x, sigmaY=sigma_y)`.

    One `filter2d` call with `gaussian_kernel(ksize, sigma_x, sigma_y, img.dtype)` (a
    rank-1 kernel: `method="auto"` takes the separable passes for large ones on CUDA).
    uint8 and uint16 results equal OpenCV's fixed-point ones except where the exact sum
    ends in exactly one half: OpenCV rounds those up, imgfilter (as `filter2d`) to even,
    1 LSB apart; the separable passes may also round a sum within float32 precision of
    a half the other way (1 LSB). float32: within float32 rounding of OpenCV's.

    Args:
        img: As `filter2d` (host or device). ksize, sigma_x, sigma_y: as `gaussian_kernel`.
        **options: `filter2d`'s (border: reflect101 by default; wrap too, unlike OpenCV).

    Returns:
        As `filter2d`: an array of img's shape and dtype; `out` when given.

    Raises:
        UsageError: What `gaussian_kernel` or `filter2d` refuses.

    Example:
        >>> import numpy as np, imgfilter
        >>> imgfilter.gaussian(np.full((5, 5), 100, np.uint8), 3, 0)[2]
        array([100, 100, 100, 100, 100], dtype=uint8)
    """
    arr, _ = _as_image(img)
    return filter2d(img, gaussian_kernel(ksize, sigma_x, sigma_y, arr.dtype), **options)


# ------------------------------------------------------------------------ derivatives


def _deriv_kernel(dx: Any, dy: Any, ksize: int) -> np.ndarray:
    """`np.outer(ky, kx)` of `cv2.getDerivKernels(dx, dy, ksize)` (ksize -1: Scharr)."""
    import cv2

    dx, dy = _integer(dx, "dx"), _integer(dy, "dy")
    if dx < 0 or dy < 0 or dx + dy == 0:
        raise UsageError(f"dx and dy must be >= 0 and not both 0, got dx={dx}, dy={dy}")
    for order, name in ((dx, "dx"), (dy, "dy")):
        size = 3 if ksize in (1, -1) else ksize
        if order >= size and order > 0:
            raise UsageError(f"{name}={order} needs a larger ksize than {ksize}")
    kx, ky = cv2.getDerivKernels(dx, dy, ksize, normalize=False, ktype=cv2.CV_64F)
    return np.outer(ky.ravel(), kx.ravel())


def _aperture(ksize: Any) -> int:
    k = _integer(ksize, "ksize")
    if k < 1 or k % 2 == 0 or k > 31:
        raise UsageError(f"ksize must be odd, 1 to 31, got {ksize!r}")
    return k


def _ddepth(ddepth: Any, dtype: np.dtype) -> np.dtype:
    """The result dtype: the image's for None (OpenCV's -1), else one of DDEPTHS."""
    if ddepth is None or (isinstance(ddepth, int) and ddepth == -1):
        return np.dtype(dtype)
    try:
        dt = np.dtype(ddepth)
    except TypeError:
        dt = None
    if dt not in DDEPTHS:
        names = ", ".join(str(d) for d in DDEPTHS)
        raise UsageError(
            f"ddepth must be None (the image's dtype) or one of {names}; got {ddepth!r}"
        )
    return dt


def _host_out(out: Any, arr: np.ndarray, dtype: np.dtype) -> None:
    """UsageError unless `out` (when given) is a C-contiguous NumPy array of `arr`'s
    shape and `dtype`, not sharing memory with `arr`."""
    if out is None:
        return
    if not isinstance(out, np.ndarray) or not out.flags.c_contiguous:
        raise UsageError("out must be a C-contiguous NumPy array for a host image")
    if out.shape != arr.shape or out.dtype != dtype:
        raise UsageError(f"out must be {dtype} of shape {arr.shape}, got {out.dtype} {out.shape}")
    if np.shares_memory(out, arr):
        raise UsageError("out overlaps the input image; filters cannot run in place")


def _saturate(values: np.ndarray, dtype: np.dtype, out: Any) -> np.ndarray:
    """`values` as `dtype` by OpenCV's saturate_cast (integers rounded half to even and
    clipped, NaN to the lowest value as cvRound's INT_MIN saturates; floats cast), in
    `out` when given."""
    if dtype.kind == "f":
        return _into(values.astype(dtype, copy=False), out)
    info = np.iinfo(dtype)
    r = np.rint(values)
    np.clip(r, info.min, info.max, out=r)
    if np.isnan(r).any():
        r[np.isnan(r)] = info.min
    return _into(r.astype(dtype), out)


def _into(result: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """`result`, or `out` holding it when given."""
    if out is None:
        return result
    np.copyto(out, result)
    return out


def _derivative(img: Any, kernel: np.ndarray, scale: Any, delta: Any, ddepth: Any,
                name: str, options: dict[str, Any]) -> Any:  # fmt: skip
    """`kernel * scale` correlated with `img`, plus `delta`, as `ddepth`: OpenCV's
    `sepFilter2D`/`filter2D` with that ddepth and delta."""
    arr, device = _as_image(img)
    src = np.dtype(arr.dtype)
    dst = _ddepth(ddepth, src)
    k = kernel * _number(scale, "scale")
    delta = _number(delta, "delta")
    k32 = k.astype(np.float32)
    # Integer kernels on integer images: float32 sums are exact while every partial sum
    # stays below 2**24 (sum |k| * the dtype's largest value): all 8-bit cases, 16-bit
    # up to 5x5. Beyond, a host image goes as its two bytes (each sum below 2**24),
    # joined in float64; a device image's sums are float32's, as OpenCV's own are.
    integral = src.kind == "u" and bool(np.all(k == np.round(k)))
    split = integral and float(np.abs(k).sum()) * np.iinfo(src).max >= _FLOAT32_EXACT
    out = options.pop("out", None)
    if dst == src and delta == 0 and (device or not split):
        return filter2d(img, k32, out=out, **options)
    if device:
        raise UsageError(
            f"{name} of a device image gives its dtype ({src}) without delta: one filter2d "
            "call; convert the image to float32 first, or pass a host image"
        )
    _host_out(out, arr, dst)
    if split:
        high = filter2d((arr >> 8).astype(np.float32), k32, **options)
        low = filter2d((arr & 255).astype(np.float32), k32, **options)
        sums = high.astype(np.float64) * 256 + low + delta
    else:
        sums = filter2d(arr.astype(np.float32, copy=False), k32, **options)
        if delta:
            sums += np.float32(delta)
    return _saturate(sums, dst, out)


def sobel(img: Any, dx: int, dy: int, ksize: int = 3, scale: float = 1.0, delta: float = 0.0,
          ddepth: Any = None, **options: Any) -> Any:  # fmt: skip
    """Sobel derivative, equal to `cv2.Sobel(img, ddepth, dx, dy, ksize=ksize, scale=scale,
    delta=delta, borderType=...)`.

    The kernel is `np.outer(ky, kx)` of `cv2.getDerivKernels(dx, dy, ksize)` times
    `scale` (ksize 1: a 3-tap difference, no smoothing). `ddepth` is the result's dtype:
    np.uint8, np.uint16, np.int16, np.float32, np.float64, or None (OpenCV's -1) for
    the image's. The result is the correlation plus `delta`, rounded half to even and
    saturated for integer dtypes: bit-exact with OpenCV for integer images with integer
    `scale` and `delta` (sums exact in float32; for 16-bit host images with 7x7 and
    larger kernels, summed per byte), else within 1 LSB; float results within float32
    rounding (float64 results are the float32 sums widened).

    The image's own dtype without delta is one `filter2d` call (host or device image;
    a 16-bit device image's 7x7 and larger kernels sum in float32, as OpenCV's do);
    other ddepths or a delta filter a float32 copy of a host image.

    Args:
        img: As `filter2d`. dx, dy: derivative orders (>= 0, not both 0, each below the
            kernel side). ksize: 1, 3, 5, ... 31. scale, delta: as OpenCV's.
        ddepth: The result dtype, or None for the image's.
        **options: `filter2d`'s options; out of the result's dtype.

    Raises:
        UsageError: A bad order, ksize, ddepth, scale or delta; a device image with
            another ddepth or a delta; what `filter2d` refuses.

    Example:
        >>> import numpy as np, imgfilter
        >>> img = np.tile(np.arange(6, dtype=np.uint8) * 10, (4, 1))
        >>> imgfilter.sobel(img, 1, 0, ddepth=np.int16)[1]
        array([ 0, 80, 80, 80, 80,  0], dtype=int16)
    """
    kernel = _deriv_kernel(dx, dy, _aperture(ksize))
    return _derivative(img, kernel, scale, delta, ddepth, "sobel", options)


def scharr(img: Any, dx: int, dy: int, scale: float = 1.0, delta: float = 0.0,
           ddepth: Any = None, **options: Any) -> Any:  # fmt: skip
    """Scharr derivative, equal to `cv2.Scharr(img, ddepth, dx, dy, scale=scale,
    delta=delta, borderType=...)`: `sobel`'s rules with OpenCV's 3x3 Scharr kernel
    (`cv2.getDerivKernels(dx, dy, -1)`: [-1, 0, 1] across [3, 10, 3]). (dx, dy) is
    (1, 0) or (0, 1).

    Raises:
        UsageError: Another (dx, dy), or what `sobel` refuses.
    """
    if (_integer(dx, "dx"), _integer(dy, "dy")) not in ((1, 0), (0, 1)):
        raise UsageError(f"scharr takes (dx, dy) = (1, 0) or (0, 1), got ({dx}, {dy})")
    kernel = _deriv_kernel(dx, dy, -1)
    return _derivative(img, kernel, scale, delta, ddepth, "scharr", options)


_LAPLACE_3 = {
    1: np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], np.float64),
    3: np.array([[2, 0, 2], [0, -8, 0], [2, 0, 2]], np.float64),
}


def laplacian(img: Any, ksize: int = 1, scale: float = 1.0, delta: float = 0.0,
              ddepth: Any = None, **options: Any) -> Any:  # fmt: skip
    """Laplacian, equal to `cv2.Laplacian(img, ddepth, ksize=ksize, scale=scale,
    delta=delta, borderType=...)`, with `sobel`'s ddepth, rounding and exactness rules.

    ksize 1 and 3 are OpenCV's 3x3 kernels ([[0,1,0],[1,-4,1],[0,1,0]] and
    [[2,0,2],[0,-8,0],[2,0,2]]); larger odd sizes the sum of the second derivatives in
    x and y, `outer(s, d) + outer(d, s)` of `cv2.getDerivKernels(2, 0, ksize)`'s
    (d, s), as one kernel.

    Raises:
        UsageError: An even or out-of-range ksize (1 to 31), or what `sobel` refuses.
    """
    k = _aperture(ksize)
    if k in _LAPLACE_3:
        kernel = _LAPLACE_3[k]
    else:
        xx = _deriv_kernel(2, 0, k)
        kernel = xx + xx.T
    return _derivative(img, kernel, scale, delta, ddepth, "laplacian", options)


# ---------------------------------------------------------------- built on the above


def gradient_magnitude(img: Any, ksize: int = 3, dtype: Any = np.float32, **options: Any) -> Any:
    """Gradient magnitude `sqrt(gx**2 + gy**2)` of `gx = cv2.Sobel(img, cv2.CV_32F, 1, 0,
    ksize=ksize)` and `gy` (0, 1), each channel alone: `cv2.magnitude` of the two.

    `dtype` np.float32 (default) gives the magnitude correctly rounded to float32
    (`cv2.magnitude` approximates the root: within 2 units in the last place of it);
    np.uint8 gives `round(magnitude * a)` (half to even), at most 255, with a = 1 for a
    uint8 image, 255 / 65535 for uint16 and 255 for float32 (an image in [0, 1]): the
    rule of `cv2.convertScaleAbs(magnitude, alpha=a)`. A uint8 image's 3x3 Sobel
    magnitude reaches 1442: strong edges saturate. The derivatives are exact for
    integer images (`sobel`). Host images only: the root runs on the host, the
    derivatives as `filter2d` calls on the chosen backend.

    Args:
        img: A host image, as `filter2d`. ksize: Sobel's, 1 to 31 odd.
        dtype: np.float32 or np.uint8.
        **options: `filter2d`'s options; out of `dtype`.

    Raises:
        UsageError: A device image, another dtype, or what `sobel` refuses.
    """
    arr, device = _as_image(img)
    if device:
        raise UsageError("gradient_magnitude takes host images; its square root runs on the host")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.float32, np.uint8):
        raise UsageError(f"gradient_magnitude's dtype is np.float32 or np.uint8, got {dtype!r}")
    out = options.pop("out", None)
    _host_out(out, arr, dt)
    gx = sobel(arr, 1, 0, ksize, ddepth=np.float64, **options)
    gy = sobel(arr, 0, 1, ksize, ddepth=np.float64, **options)
    magnitude = np.sqrt(gx * gx + gy * gy)  # float64: rounded once, to float32 or uint8
    if dt == np.float32:
        return _saturate(magnitude, dt, out)
    alpha = {np.dtype(np.uint8): 1.0, np.dtype(np.uint16): 255 / 65535}.get(arr.dtype, 255.0)
    return _saturate(magnitude * alpha, dt, out)


def sharpen(img: Any, sigma: float, amount: float = 1.0, threshold: float = 0.0, *,
            ksize: int | tuple[int, int] = 0, **options: Any) -> Any:  # fmt: skip
    """Unsharp mask: `img + amount * (img - blurred)`, rounded half to even and saturated.

    `blurred` is the exact (unrounded) correlation with `gaussian_kernel(ksize, sigma,
    sigma, img.dtype)`, the blur `gaussian(img, ksize, sigma)` rounds, so the result is
    one `filter2d` call with the kernel `(1 + amount) * identity - amount * gaussian`
    (host or device images): within 1 LSB of that formula in float64 for integer
    images, float32 rounding for float32 ones. With `threshold` > 0, each value where
    `|img - gaussian(img, ksize, sigma)|` is below `threshold` keeps its input value
    (a second `filter2d` call; host images only), so flat areas and faint noise are
    left as they are.

    Args:
        img: As `filter2d`. sigma: The blur's standard deviation (> 0 unless ksize is
            given). amount: How much of the difference is added (0: none).
        threshold: In the image's values (0 to 255 for uint8); 0 sharpens everywhere.
        ksize: The blur's kernel side(s), as `gaussian`'s (0: from sigma).
        **options: `filter2d`'s options.

    Raises:
        UsageError: A bad sigma or ksize (`gaussian_kernel`), amount, threshold (< 0),
            a device image with a threshold; what `filter2d` refuses.

    Example:
        >>> import numpy as np, imgfilter
        >>> img = np.zeros((5, 5), np.uint8); img[:, 2:] = 100
        >>> imgfilter.sharpen(img, 1.0, 1.0)[0]
        array([  0,   0, 130, 106, 101], dtype=uint8)
    """
    arr, device = _as_image(img)
    g = gaussian_kernel(ksize, sigma, sigma, arr.dtype)
    amount, threshold = _number(amount, "amount"), _number(threshold, "threshold")
    if threshold < 0:
        raise UsageError(f"threshold must be >= 0, got {threshold:g}")
    if threshold > 0 and device:
        raise UsageError("sharpen's threshold takes host images; its comparison runs on the host")
    kernel = -amount * g.astype(np.float64)
    kernel[g.shape[0] // 2, g.shape[1] // 2] += 1 + amount
    sharp = filter2d(img, kernel.astype(np.float32), **options)
    if threshold > 0:
        options.pop("out", None)
        blurred = filter2d(arr, g, **options)
        keep = np.abs(arr.astype(np.float32) - blurred) < threshold
        np.copyto(sharp, arr, where=keep)
    return sharp
