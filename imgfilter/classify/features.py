"""Per-pixel features for the pixel classifier, from imgfilter's own filters.

A feature set is a small JSON-able dict (stored in every model, so `train` and
`classify` always compute the same features):

    {"raw": true, "gauss": [1, 2, 4], "box": [15], "edges": [1, 2, 4], "contour": true}

For an image with `channels` colour channels (1 for gray, 3 for BGR; a fourth, alpha,
channel is ignored) the features are, in this order:

- raw: each colour channel, scaled to [0, 1] (uint8 / 255, uint16 / 65535, float32 as is);
- gauss s: each channel smoothed by a Gaussian of sigma s (radius ceil(3 s), applied as
  a 1 x n then an n x 1 `filter2d`, border reflect101);
- box k: each channel averaged over a k x k box (`blur`);
- edges s: gradient magnitude sqrt(gx^2 + gy^2) of the gray image (0.114 B + 0.587 G +
  0.299 R) smoothed at sigma s, gx and gy the Sobel kernels divided by 8;
- contour: imgfilter's contour map of the 8-bit image (`contour`), scaled to [0, 1]
  (uint16 images use their own 16-bit contour map; float32 images are rounded to 8 bits
  first).

Both engines (`cpu`: NumPy and the CPU backend's filters; `cuda`: the CUDA backend's
kernels and a few small kernels of `imgfilter.classify.cuda`) compute the same list.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import UsageError

DEFAULT_SPEC: dict[str, Any] = {
    "raw": True,
    "gauss": [1.0, 2.0, 4.0],
    "box": [15],
    "edges": [1.0, 2.0, 4.0],
    "contour": True,
}
MAX_SIGMA = 10.0  # radius 30: the 1-D passes stay within the blocked kernels' 31 taps
MAX_BOX = 255
GRAY_WEIGHTS = (np.float32(0.114), np.float32(0.587), np.float32(0.299))  # B, G, R
SOBEL_X = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.float32) / np.float32(8)
SOBEL_Y = np.ascontiguousarray(SOBEL_X.T)
_KEYS = ("raw", "gauss", "box", "edges", "contour")


def normalize_spec(spec: Any) -> dict[str, Any]:
    """Check a feature set and return it in canonical form (UsageError if malformed)."""
    if spec is None:
        spec = DEFAULT_SPEC
    if not isinstance(spec, dict):
        raise UsageError(f"feature set must be a dict, got {type(spec).__name__}")
    unknown = set(spec) - set(_KEYS)
    if unknown:
        raise UsageError(f"unknown feature kinds {sorted(unknown)}; known: {', '.join(_KEYS)}")
    out: dict[str, Any] = {
        "raw": bool(spec.get("raw", False)),
        "contour": bool(spec.get("contour", False)),
    }
    for key in ("gauss", "edges"):
        values = spec.get(key, [])
        if not isinstance(values, (list, tuple)):
            raise UsageError(f"feature set: {key} must be a list of sigmas")
        sigmas = []
        for s in values:
            if isinstance(s, bool) or not isinstance(s, (int, float)):
                raise UsageError(f"feature set: {key} sigma {s!r} is not a number")
            if not (0.0 < float(s) <= MAX_SIGMA):
                raise UsageError(f"feature set: {key} sigma {s} must be in (0, {MAX_SIGMA}]")
            sigmas.append(float(s))
        out[key] = sigmas
    sizes = []
    values = spec.get("box", [])
    if not isinstance(values, (list, tuple)):
        raise UsageError("feature set: box must be a list of sizes")
    for k in values:
        if isinstance(k, bool) or not isinstance(k, (int, float)) or int(k) != k:
            raise UsageError(f"feature set: box size {k!r} is not an integer")
        if not 1 <= int(k) <= MAX_BOX:
            raise UsageError(f"feature set: box size {k} must be in 1..{MAX_BOX}")
        sizes.append(int(k))
    out["box"] = sizes
    if not feature_names(out, 1):
        raise UsageError("feature set is empty")
    return {key: out[key] for key in _KEYS}


def parse_spec(text: str) -> dict[str, Any]:
    """A feature set from the command line: 'gauss=1,2,4;box=15;edges=1,2;raw;contour'."""
    spec: dict[str, Any] = {"raw": False, "gauss": [], "box": [], "edges": [], "contour": False}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, _, values = part.partition("=")
        name = name.strip().lower()
        if name not in _KEYS:
            raise UsageError(f"unknown feature kind {name!r}; known: {', '.join(_KEYS)}")
        if name in ("raw", "contour"):
            if values.strip() not in ("", "1", "true", "yes"):
                raise UsageError(f"feature {name} takes no values")
            spec[name] = True
            continue
        try:
            numbers = [float(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise UsageError(f"feature {name}: {values!r} is not a list of numbers") from None
        spec[name] = numbers
    return normalize_spec(spec)


def feature_names(spec: dict[str, Any], channels: int) -> list[str]:
    """Names of the features, in matrix-column order."""
    names = []
    chans = [f"c{c}" for c in range(channels)]
    if spec.get("raw"):
        names += [f"raw[{c}]" for c in chans]
    for s in spec.get("gauss", []):
        names += [f"gauss{s:g}[{c}]" for c in chans]
    for k in spec.get("box", []):
        names += [f"box{k}[{c}]" for c in chans]
    for s in spec.get("edges", []):
        names.append(f"edges{s:g}")
    if spec.get("contour"):
        names.append("contour")
    return names


def gaussian_1d(sigma: float) -> np.ndarray:
    """Normalised Gaussian taps, radius ceil(3 sigma), float32."""
    radius = max(1, math.ceil(3.0 * sigma))
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    g = np.exp(-0.5 * (x / sigma) ** 2)
    return (g / g.sum()).astype(np.float32)


def colour_channels(img: np.ndarray) -> int:
    """Colour channels used as features: 1 for gray, 3 for BGR and BGRA."""
    return 1 if img.ndim == 2 or img.shape[2] == 1 else 3


def scale_of(dtype: Any) -> np.float32:
    """The factor that maps the dtype's full range to [0, 1]."""
    dt = np.dtype(dtype)
    if dt == np.uint8:
        return np.float32(1.0 / 255.0)
    if dt == np.uint16:
        return np.float32(1.0 / 65535.0)
    return np.float32(1.0)


def contour_source(img: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """The integer image the contour feature is computed from, and its scale."""
    if img.dtype.kind == "u":
        return img, scale_of(img.dtype)
    q = np.rint(np.clip(np.nan_to_num(img, nan=0.0), 0.0, 1.0) * 255.0).astype(np.uint8)
    return q, scale_of(np.uint8)
