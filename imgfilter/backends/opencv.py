"""OpenCV reference implementations: what imgfilter must agree with. Never the engine.

Used by `imgfilter compare`, the benchmarks and the tests. Takes and returns host
arrays shaped (H, W) or (H, W, C). Wrap (periodic) borders, which cv2.filter2D
refuses, are defined as `np.pad(mode="wrap")` followed by a valid correlation.
A constant border with a non-zero value pads with `cv2.copyMakeBorder` first.
"""

from __future__ import annotations

import numpy as np

from ..border import OPENCV_BORDER, border_name

CONTOUR_KERNELS = (
    np.array([[-1, 0, 1]] * 3, dtype=np.float32),
    -np.array([[-1, 0, 1]] * 3, dtype=np.float32),
    np.array([[-1, -1, -1], [0, 0, 0], [1, 1, 1]], dtype=np.float32),
    -np.array([[-1, -1, -1], [0, 0, 0], [1, 1, 1]], dtype=np.float32),
)


def filter2d(
    img: np.ndarray,
    kernel: np.ndarray,
    anchor: tuple[int, int] | None = None,
    border: str = "reflect101",
    border_value: float = 0.0,
) -> np.ndarray:
    """`cv2.filter2D(img, -1, kernel, anchor, borderType)`, extended to wrap and cval.

    anchor is OpenCV's (x, y); None is the centre.
    """
    import cv2

    k = np.asarray(kernel, dtype=np.float32)
    if k.ndim == 1:
        k = k.reshape(-1, 1)
    kh, kw = k.shape
    ax, ay = (-1, -1) if anchor is None else anchor
    ax = kw // 2 if ax == -1 else ax
    ay = kh // 2 if ay == -1 else ay
    name = border_name(border)
    if (
        name == "reflect101"
        or name == "reflect"
        or name == "replicate"
        or (name == "constant" and border_value == 0)
    ):
        return cv2.filter2D(img, -1, k, anchor=(ax, ay), borderType=OPENCV_BORDER[name])
    top, bottom, left, right = ay, kh - 1 - ay, ax, kw - 1 - ax
    if name == "wrap":
        widths = ((top, bottom), (left, right)) + ((0, 0),) * (img.ndim - 2)
        padded = np.pad(img, widths, mode="wrap")
    else:
        padded = cv2.copyMakeBorder(
            img, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(border_value,) * 4
        )
    full = cv2.filter2D(padded, -1, k, anchor=(ax, ay), borderType=cv2.BORDER_CONSTANT)
    return np.ascontiguousarray(full[top : top + img.shape[0], left : left + img.shape[1]])


def blur(
    img: np.ndarray, k: int | tuple[int, int], border: str = "reflect101", border_value=0.0
) -> np.ndarray:
    """`cv2.blur(img, (kw, kh))`; k is a side or OpenCV's (width, height)."""
    import cv2

    kw, kh = (k, k) if np.isscalar(k) else k
    name = border_name(border)
    if name in ("wrap", "constant"):
        box = np.full((kh, kw), 1.0 / (kh * kw), dtype=np.float32)
        return filter2d(img, box, None, name, border_value)
    return cv2.blur(img, (kw, kh), borderType=OPENCV_BORDER[name])


def to_gray(img: np.ndarray) -> np.ndarray:
    """`cv2.cvtColor` to gray for 3/4-channel BGR(A) images; gray images pass through."""
    import cv2

    if img.ndim == 2:
        return img
    if img.shape[2] == 1:
        return img[:, :, 0]
    code = cv2.COLOR_BGR2GRAY if img.shape[2] == 3 else cv2.COLOR_BGRA2GRAY
    return cv2.cvtColor(img, code)


def contour(img: np.ndarray, border: str = "reflect101", border_value: float = 0.0) -> np.ndarray:
    """Gray, then four cv2.filter2D edge responses (saturated), then cv2.bitwise_or."""
    import cv2

    gray = to_gray(img)
    out = None
    for k in CONTOUR_KERNELS:
        r = filter2d(gray, k, None, border, border_value)
        out = r if out is None else cv2.bitwise_or(out, r)
    return out
