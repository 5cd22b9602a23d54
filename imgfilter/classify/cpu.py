"""The pixel classifier's CPU engine: NumPy, OpenCV's box filter and the CPU backend's
filters.

Same arithmetic as the CUDA engine (float32 features, logits and softmax), so both
give the same probabilities within 1e-4.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import api
from .features import GRAY_WEIGHTS, contour_source, scale_of

NAME = "cpu"


class FeatureEngine:
    """Feature matrix (P, F) float32 on the host."""

    def prepare(self, img: np.ndarray, ch: int) -> tuple[np.ndarray, np.ndarray]:
        h, w = img.shape[:2]
        src = img.reshape(h, w, -1)[:, :, :ch]
        planes = np.ascontiguousarray(src.astype(np.float32) * scale_of(img.dtype))
        if ch == 1:
            gray = planes
        else:
            wb, wg, wr = GRAY_WEIGHTS
            gray = (wb * planes[:, :, 0] + wg * planes[:, :, 1]) + wr * planes[:, :, 2]
            gray = np.ascontiguousarray(gray[:, :, None], dtype=np.float32)
        return planes, gray

    def filter2d(self, a: np.ndarray, kernel: np.ndarray) -> np.ndarray:
        return api.filter2d(a, kernel, backend="cpu")

    def blur(self, a: np.ndarray, k: int) -> np.ndarray:
        # cv2.blur of the float32 planes (double running sums) is the CPU backend's
        # float32 box (sums that never subtract) to within float32 rounding on these
        # finite [0, 1] planes, and 5-30x faster than its NumPy sums.
        import cv2

        out = cv2.blur(a, (k, k), borderType=cv2.BORDER_REFLECT_101)
        return out.reshape(a.shape)

    def contour_source(self, img: np.ndarray) -> tuple[np.ndarray, np.float32]:
        return contour_source(img)

    def contour(self, u: np.ndarray) -> np.ndarray:
        return api.contour(u, backend="cpu")

    def matrix(self, pixels: int, features: int) -> np.ndarray:
        return np.empty((pixels, features), dtype=np.float32)

    def put(self, X: np.ndarray, col: int, a: np.ndarray, scale: np.float32) -> None:
        k = 1 if a.ndim == 2 else a.shape[2]
        src = a.reshape(X.shape[0], k)
        if scale == 1:
            X[:, col : col + k] = src
        else:
            X[:, col : col + k] = src.astype(np.float32) * scale

    def put_hypot(self, X: np.ndarray, col: int, gx: np.ndarray, gy: np.ndarray) -> None:
        gx = gx.reshape(-1)
        gy = gy.reshape(-1)
        X[:, col] = np.sqrt(gx * gx + gy * gy)

    def finish(self, X: np.ndarray) -> np.ndarray:
        return X


def gather(X: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Rows `index` of the feature matrix, (n, F) float32 on the host."""
    return X[index]


def softmax_rows(logits: np.ndarray, log: bool = False) -> np.ndarray:
    """Row softmax (or log-softmax) in float32, the max subtracted first."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=1, keepdims=True, dtype=np.float32)
    if log:
        return z - np.log(s)
    return e / s


def predict(
    X: np.ndarray, W: np.ndarray, b: np.ndarray, *, proba: bool, lut=None
) -> dict[str, Any]:
    """lut[class index] (uint8; the argmax of the probabilities; lut None: the index)
    and the probabilities of each row.

    W (C, F) and b (C,) float32 already include the standardisation and temperature.
    """
    logits = X @ W.T
    logits += b
    p = softmax_rows(logits)
    index = np.argmax(p, axis=1).astype(np.uint8)
    if lut is not None:
        index = np.take(np.asarray(lut, np.uint8), index)
    return {"index": index, "proba": p if proba else None, "times": {}}


class TrainEngine:
    """Loss pieces of softmax regression on the standardised training rows (host)."""

    def __init__(self, Z: np.ndarray):
        self.Z = np.ascontiguousarray(Z, dtype=np.float32)  # (n, Fa): features, 1, zeros

    def log_proba(self, Wa: np.ndarray) -> np.ndarray:
        return softmax_rows(self.Z @ Wa.T, log=True)

    def grad(self, R: np.ndarray) -> np.ndarray:
        """R^T Z: (C, Fa) for the (n, C) residuals R."""
        return np.ascontiguousarray(R.T) @ self.Z
