"""The pixel classifier's CUDA engine: features, logits and probabilities on the GPU.

Features come from the CUDA backend's filters (device arrays in, device arrays out)
and are assembled by small kernels here into one (P, Fa) float32 matrix, P pixels by
Fa = the F features, a column of ones (the bias) and zero columns up to a multiple of
4 (so every row is 16-byte aligned for GEMV's 128-bit loads).

Classification (`predict`), as issue 6 asks: the logits of class c are one GEMV,
`kernels.gemv.gemv(X, [W_c - W_last, b_c - b_last, 0...])`, written into column c of a
(P, C) logits matrix whose last column is zero (softmax does not change when a row's
logits all shift by the same amount, so C - 1 GEMVs suffice); `kernels.softmax.softmax`
turns each row into probabilities; a last kernel takes each row's argmax.
`predict(..., method="fused")` is the alternative measured by
benchmarks/classify_bench.py: one kernel reads each pixel's features once and writes
its C probabilities and label (it reads X once instead of C - 1 times).

Training (`TrainEngine`): the labelled rows' standardised features Z (n, Fa) and Z^T
stay on the device; each evaluation runs C GEMVs for the logits, the log-softmax
kernel, and C GEMVs of Z^T with the residual columns for the gradient.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import config, cuda, float32, uint32

from kernels.arrays import as_device_array, is_device_array
from kernels.gemv import gemv
from kernels.softmax import softmax

from .. import api
from .features import GRAY_WEIGHTS, scale_of

NAME = "cuda"
BLOCK = 256
MAX_FUSED_CLASSES = 16
config.CUDA_LOW_OCCUPANCY_WARNINGS = False

_WB, _WG, _WR = (float(w) for w in GRAY_WEIGHTS)


def padded_width(features: int) -> int:
    """Columns of the device feature matrix: features, the bias column, zero padding."""
    return (features + 1 + 3) // 4 * 4


def _grid(n: int) -> int:
    return max(1, (n + BLOCK - 1) // BLOCK)


# ------------------------------------------------------------------------------ kernels


@cuda.jit(cache=True)
def _prepare3(img, scale, planes, gray):
    """planes = first three channels * scale (float32); gray = 0.114 B + 0.587 G + 0.299 R."""
    i = cuda.grid(1)
    h, w, _ = planes.shape
    if i < h * w:
        y = uint32(i // w)
        x = uint32(i - (i // w) * w)
        b = float32(img[y, x, 0]) * scale
        g = float32(img[y, x, 1]) * scale
        r = float32(img[y, x, 2]) * scale
        planes[y, x, 0] = b
        planes[y, x, 1] = g
        planes[y, x, 2] = r
        gray[y, x, 0] = (float32(_WB) * b + float32(_WG) * g) + float32(_WR) * r


@cuda.jit(cache=True)
def _prepare1(img, scale, planes):
    i = cuda.grid(1)
    h, w, _ = planes.shape
    if i < h * w:
        y = uint32(i // w)
        x = uint32(i - (i // w) * w)
        planes[y, x, 0] = float32(img[y, x, 0]) * scale


@cuda.jit(cache=True)
def _put(src, X, col, scale):
    """X[p, col + j] = src[p, j] * scale for the (P, k) source."""
    i = cuda.grid(1)
    n, k = src.shape
    if i < n * k:
        p = uint32(i // k)
        j = uint32(i - (i // k) * k)
        X[p, uint32(col) + j] = float32(src[p, j]) * scale


@cuda.jit(cache=True)
def _put_hypot(gx, gy, X, col):
    p = cuda.grid(1)
    if p < X.shape[0]:
        a = gx[uint32(p)]
        b = gy[uint32(p)]
        X[uint32(p), uint32(col)] = math.sqrt(a * a + b * b)


@cuda.jit(cache=True)
def _put_tail(X, col):
    """The bias column (ones) and the zero padding after it."""
    p = cuda.grid(1)
    if p < X.shape[0]:
        X[uint32(p), uint32(col)] = float32(1.0)
        for j in range(col + 1, X.shape[1]):
            X[uint32(p), uint32(j)] = float32(0.0)


@cuda.jit(cache=True)
def _gather(X, index, out):
    """out[i, j] = X[index[i], j] for the first out.shape[1] columns."""
    t = cuda.grid(1)
    n, f = out.shape
    if t < n * f:
        i = uint32(t // f)
        j = uint32(t - (t // f) * f)
        out[i, j] = X[uint32(index[i]), j]


@cuda.jit(cache=True)
def _argmax_rows(P, lut, out):
    """out[p] = lut[index of the largest entry of row p] (the first on ties), uint8:
    lut maps class indices to the model's class numbers."""
    p = cuda.grid(1)
    if p < P.shape[0]:
        up = uint32(p)
        best = P[up, 0]
        arg = 0
        for c in range(1, P.shape[1]):
            v = P[up, uint32(c)]
            if v > best:
                best = v
                arg = c
        out[up] = lut[arg]


FUSED_ROWS = 128  # pixels (rows of X) per block of the fused kernel


def _fused_kernel(classes: int, width: int):
    """One block per 128 pixels: the block copies its 128 rows of X (contiguous, so
    the loads are coalesced) into shared memory with a row stride of width + 1 words
    (no bank conflicts), then each thread computes its pixel's C logits, the softmax in
    registers, and writes the probabilities and the argmax. Weights from shared memory."""
    C, FA = classes, width
    S = FA + 1
    T = FUSED_ROWS
    TILE_WORDS = T * S  # shared-array sizes must be plain constants for Numba
    W_WORDS = C * FA

    @cuda.jit(cache=True)
    def fused(X, Wx, lut, probs, index):
        tile = cuda.shared.array(TILE_WORDS, float32)
        sw = cuda.shared.array(W_WORDS, float32)
        t = cuda.threadIdx.x
        i = t
        while i < W_WORDS:
            sw[i] = Wx[i // FA, i % FA]
            i += T
        n = X.shape[0]
        row0 = cuda.blockIdx.x * T
        rows = min(T, n - row0)
        i = t
        while i < rows * FA:
            r = i // FA
            tile[r * S + (i - r * FA)] = X[uint32(row0 + r), uint32(i - r * FA)]
            i += T
        cuda.syncthreads()
        if t >= rows:
            return
        acc = cuda.local.array(C, float32)
        for c in range(C):
            acc[c] = float32(0.0)
        base = t * S
        for j in range(FA):
            v = tile[base + j]
            for c in range(C):
                acc[c] += sw[c * FA + j] * v
        m = acc[0]
        arg = 0
        for c in range(1, C):
            if acc[c] > m:
                m = acc[c]
                arg = c
        s = float32(0.0)
        for c in range(C):
            e = math.exp(acc[c] - m)
            acc[c] = e
            s += e
        inv = float32(1.0) / s
        p = uint32(row0 + t)
        for c in range(C):
            probs[p, uint32(c)] = acc[c] * inv
        index[p] = lut[arg]

    return fused


_FUSED: dict[tuple[int, int], Any] = {}


# ------------------------------------------------------------------------------ features


class FeatureEngine:
    """Feature matrix (P, Fa) float32 on the device (see the module docstring)."""

    def __init__(self) -> None:
        self.device_image = None

    def prepare(self, img, ch: int):
        """Upload the image (a device image is used in place) and scale it to float32."""
        h, w = img.shape[:2]
        if is_device_array(img):
            dimg = as_device_array(img).reshape(h, w, -1)
        else:
            dimg = cuda.to_device(np.ascontiguousarray(img.reshape(h, w, -1)))
        self.device_image = dimg
        planes = cuda.device_array((h, w, ch), np.float32)
        scale = scale_of(img.dtype)
        if ch == 3:
            gray = cuda.device_array((h, w, 1), np.float32)
            _prepare3[_grid(h * w), BLOCK](dimg, scale, planes, gray)
        else:
            _prepare1[_grid(h * w), BLOCK](dimg, scale, planes)
            gray = planes
        return planes, gray

    def filter2d(self, a, kernel: np.ndarray):
        return api.filter2d(a, kernel, backend="cuda")

    def blur(self, a, k: int):
        return api.blur(a, k, backend="cuda")

    def contour(self, u: np.ndarray):
        dimg = self.device_image
        if dimg is None or np.dtype(dimg.dtype) != u.dtype:
            dimg = cuda.to_device(np.ascontiguousarray(u))
        return api.contour(dimg, backend="cuda")

    def matrix(self, pixels: int, features: int):
        self.features = features
        return cuda.device_array((pixels, padded_width(features)), np.float32)

    def put(self, X, col: int, a, scale) -> None:
        n = X.shape[0]
        k = 1 if a.ndim == 2 else a.shape[2]
        src = a.reshape(n, k)
        _put[_grid(n * k), BLOCK](src, X, col, np.float32(scale))

    def put_hypot(self, X, col: int, gx, gy) -> None:
        n = X.shape[0]
        _put_hypot[_grid(n), BLOCK](gx.reshape(n), gy.reshape(n), X, col)

    def finish(self, X):
        _put_tail[_grid(X.shape[0]), BLOCK](X, self.features)
        self.device_image = None
        return X


def gather(X, index: np.ndarray, features: int) -> np.ndarray:
    """Rows `index` (first `features` columns) of the device matrix, on the host."""
    n = int(index.shape[0])
    out = cuda.device_array((n, features), np.float32)
    if n:
        _gather[_grid(n * features), BLOCK](X, cuda.to_device(index.astype(np.int64)), out)
    return out.copy_to_host()


# ------------------------------------------------------------------------------ classify


def weight_rows(W: np.ndarray, b: np.ndarray, width: int) -> np.ndarray:
    """(C, Fa) float32: each class's weights, its bias in the ones column, zeros."""
    C, F = W.shape
    rows = np.zeros((C, width), np.float32)
    rows[:, :F] = W
    rows[:, F] = b
    return rows


def logits(X, dW):
    """(P, C) device logits: column c is gemv(X, dW[c])."""
    C = dW.shape[0]
    out = cuda.device_array((X.shape[0], C), np.float32)
    for c in range(C):
        gemv(X, dW[c], out=out[:, c])
    return out


@cuda.jit(cache=True)
def _zero_column(L, c):
    p = cuda.grid(1)
    if p < L.shape[0]:
        L[uint32(p), uint32(c)] = float32(0.0)


def relative_rows(rows: np.ndarray) -> np.ndarray:
    """Each class's weight row minus the last class's, for the C - 1 first classes.

    softmax(z) = softmax(z - z_last), so logits relative to the last class give the same
    probabilities with one GEMV (one pass over X) fewer: 2 instead of 3 for 3 classes."""
    rows = np.asarray(rows, np.float64)
    return (rows[:-1] - rows[-1]).astype(np.float32)


def logits_relative(X, dWrel):
    """(P, C) device logits relative to the last class: C - 1 GEMVs, a zero last column."""
    n, Cm1 = X.shape[0], dWrel.shape[0]
    out = cuda.device_array((n, Cm1 + 1), np.float32)
    for c in range(Cm1):
        gemv(X, dWrel[c], out=out[:, c])
    _zero_column[_grid(n), BLOCK](out, Cm1)
    return out


def probabilities(dlogits):
    return softmax(dlogits)


def _lut(classes: int, lut):
    if lut is None:
        lut = np.arange(classes, dtype=np.uint8)
    return cuda.to_device(np.ascontiguousarray(lut, dtype=np.uint8))


def argmax(dprobs, lut=None):
    """(P,) uint8 device array: lut[argmax of each row] (lut None: the index itself)."""
    out = cuda.device_array(dprobs.shape[0], np.uint8)
    _argmax_rows[_grid(dprobs.shape[0]), BLOCK](dprobs, _lut(dprobs.shape[1], lut), out)
    return out


def fused_kernel(classes: int, width: int):
    key = (classes, width)
    kernel = _FUSED.get(key)
    if kernel is None:
        kernel = _FUSED[key] = _fused_kernel(classes, width)
    return kernel


def fused(X, dW, lut=None):
    """(probabilities (P, C), lut[class index] (P,)) from one kernel (method 'fused')."""
    C = dW.shape[0]
    n, width = X.shape
    if C > MAX_FUSED_CLASSES or width > 64:
        raise ValueError("method 'fused' handles up to 16 classes and 63 features")
    probs = cuda.device_array((n, C), np.float32)
    index = cuda.device_array(n, np.uint8)
    blocks = max(1, (n + FUSED_ROWS - 1) // FUSED_ROWS)
    fused_kernel(C, width)[blocks, FUSED_ROWS](X, dW, _lut(C, lut), probs, index)
    return probs, index


def predict(
    X, W: np.ndarray, b: np.ndarray, *, proba: bool, method: str = "gemv", lut=None
) -> dict:
    """ "index": (P,) uint8 lut[class index] (lut None: the index), "proba": (P, C) or None."""
    rows = weight_rows(W, b, X.shape[1])
    if method == "fused":
        dprobs, dindex = fused(X, cuda.to_device(rows), lut)
    else:
        # C - 1 GEMVs: logits relative to the last class (see relative_rows).
        dprobs = probabilities(logits_relative(X, cuda.to_device(relative_rows(rows))))
        dindex = argmax(dprobs, lut)
    return {
        "index": dindex.copy_to_host(),
        "proba": dprobs.copy_to_host() if proba else None,
    }


# ------------------------------------------------------------------------------ training


class TrainEngine:
    """Loss pieces of softmax regression with Z (n, Fa) and Z^T on the device."""

    def __init__(self, Z: np.ndarray):
        Z = np.ascontiguousarray(Z, dtype=np.float32)
        self.n = Z.shape[0]
        self.dZ = cuda.to_device(Z)
        self.dZt = cuda.to_device(np.ascontiguousarray(Z.T))

    def log_proba(self, Wa: np.ndarray) -> np.ndarray:
        dW = cuda.to_device(np.ascontiguousarray(Wa, dtype=np.float32))
        return softmax(logits(self.dZ, dW), log=True).copy_to_host()

    def grad(self, R: np.ndarray) -> np.ndarray:
        """R^T Z (C, Fa): row c is gemv(Z^T, R[:, c])."""
        dR = cuda.to_device(np.ascontiguousarray(R.T, dtype=np.float32))
        C = dR.shape[0]
        out = cuda.device_array((C, self.dZt.shape[0]), np.float32)
        for c in range(C):
            gemv(self.dZt, dR[c], out=out[c])
        return out.copy_to_host()
