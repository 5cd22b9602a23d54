"""The feature pipeline, written once over an engine (CPU: NumPy; CUDA: device arrays).

An engine provides: prepare(img) -> (colour planes (H, W, ch) float32 in [0, 1], gray
(H, W, 1) float32), filter2d(a, kernel), blur(a, k), contour(u) -> (H, W) integer,
contour_source(img) -> (the integer image contour() takes, its scale), matrix(P, F)
-> the feature matrix, put(X, col, a, scale) (copies a's channels, times scale, into
columns col..), put_hypot(X, col, gx, gy), finish(X). `img` is a NumPy array, or
(CUDA engine) a device array.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .features import SOBEL_X, SOBEL_Y, colour_channels, feature_names, gaussian_1d


def smooth(engine: Any, a: Any, sigma: float) -> Any:
    g = gaussian_1d(sigma)
    return engine.filter2d(engine.filter2d(a, g[None, :]), np.ascontiguousarray(g[:, None]))


def compute(engine: Any, img: np.ndarray, spec: dict[str, Any]) -> Any:
    """The (pixels x features) matrix of `img` for `spec` (see imgfilter.classify.features)."""
    h, w = img.shape[:2]
    ch = colour_channels(img)
    n_features = len(feature_names(spec, ch))
    X = engine.matrix(h * w, n_features)
    one = np.float32(1.0)
    planes, gray = engine.prepare(img, ch)
    col = 0
    if spec["raw"]:
        engine.put(X, col, planes, one)
        col += ch
    for s in spec["gauss"]:
        engine.put(X, col, smooth(engine, planes, s), one)
        col += ch
    for k in spec["box"]:
        engine.put(X, col, engine.blur(planes, k), one)
        col += ch
    for s in spec["edges"]:
        g = smooth(engine, gray, s)
        engine.put_hypot(X, col, engine.filter2d(g, SOBEL_X), engine.filter2d(g, SOBEL_Y))
        col += 1
    if spec["contour"]:
        src, scale = engine.contour_source(img)
        engine.put(X, col, engine.contour(src), scale)
        col += 1
    assert col == n_features
    return engine.finish(X)
