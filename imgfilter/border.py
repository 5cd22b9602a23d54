"""Border modes: user-facing names, imgfilter codes, OpenCV constants, host padding.

Names: reflect101 (OpenCV's default), reflect, replicate, constant (value 0 unless
given), wrap (periodic; cv2.filter2D refuses it, np.pad(mode="wrap") defines it).
"""

from __future__ import annotations

import numpy as np

from kernels.common import border_index as _bi

from .errors import UsageError
from .names import BORDER_NAMES

CODES = (_bi.REFLECT101, _bi.REFLECT, _bi.REPLICATE, _bi.CONSTANT, _bi.WRAP)
BORDERS: dict[str, int] = dict(zip(BORDER_NAMES, CODES, strict=True))  # names.BORDER_NAMES order

# OpenCV's numeric constants, so this module needs no cv2 import.
OPENCV_BORDER: dict[str, int] = {
    "constant": 0,  # cv2.BORDER_CONSTANT
    "replicate": 1,  # cv2.BORDER_REPLICATE
    "reflect": 2,  # cv2.BORDER_REFLECT
    "wrap": 3,  # cv2.BORDER_WRAP
    "reflect101": 4,  # cv2.BORDER_REFLECT_101
}

_ALIASES = {
    "reflect_101": "reflect101",
    "reflect-101": "reflect101",
    "default": "reflect101",
    "edge": "replicate",
    "zero": "constant",
}


def border_code(name: str) -> int:
    """Return imgfilter's code for a border name (case-insensitive); UsageError if unknown."""
    key = str(name).lower()
    key = _ALIASES.get(key, key)
    if key not in BORDERS:
        raise UsageError(f"unknown border mode {name!r}; choose one of {', '.join(BORDERS)}")
    return BORDERS[key]


def border_name(name: str) -> str:
    """Return the canonical border name for `name` (accepts aliases such as 'reflect_101')."""
    code = border_code(name)
    return next(k for k, v in BORDERS.items() if v == code)


def index_map(n: int, before: int, after: int, border: str) -> np.ndarray:
    """Source indices for an axis of length `n` extended by `before` and `after` samples.

    Entries are in [0, n), or -1 where a constant border supplies the value.
    """
    code = border_code(border)
    return np.array(
        [_bi.border_index(p, n, code) for p in range(-before, n + after)], dtype=np.int64
    )


def pad(
    img: np.ndarray,
    top: int,
    bottom: int,
    left: int,
    right: int,
    border: str = "reflect101",
    value: float = 0.0,
) -> np.ndarray:
    """Pad a (H, W) or (H, W, C) host array on its first two axes, OpenCV-style.

    Equals `cv2.copyMakeBorder` for reflect101/reflect/replicate/constant and
    `np.pad(mode="wrap")` for wrap, for any pad widths (also wider than the image).
    """
    rows = index_map(img.shape[0], top, bottom, border)
    cols = index_map(img.shape[1], left, right, border)
    out = img[np.clip(rows, 0, None)][:, np.clip(cols, 0, None)]
    if (rows < 0).any() or (cols < 0).any():
        out = out.copy()
        out[rows < 0] = value
        out[:, cols < 0] = value
    return out
