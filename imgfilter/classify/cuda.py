"""The pixel classifier's CUDA engine: features, logits and probabilities on the GPU.

Features come from the CUDA backend's filters (device arrays in, device arrays out)
and are assembled by small kernels (`kernels.classify`) into one (P, Fa) float32
matrix, P pixels by Fa = the F features, a column of ones (the bias) and zero columns
up to a multiple of 4 (so every row is 16-byte aligned for GEMV's 128-bit loads).

Classification (`predict`), as issue 6 asks: the logits of class c are one GEMV,
`kernels.gemv.gemv(X, [W_c - W_last, b_c - b_last, 0...])`, written into column c of a
(P, C) logits matrix (through `column`, an O(1) strided view) whose last column is
zero (softmax does not change when a row's logits all shift by the same amount, so
C - 1 GEMVs suffice); `kernels.softmax.softmax` turns each row into probabilities; a
last kernel takes each row's argmax.
`predict(..., method="fused")` is the alternative measured by
benchmarks/classify_bench.py: one kernel reads each pixel's features once and writes
its C probabilities and label (it reads X once instead of C - 1 times).

Training (`TrainEngine`): the labelled rows' standardised features Z (n, Fa) and Z^T
stay on the device; each evaluation runs C GEMVs for the logits, the log-softmax
kernel, and C GEMVs of Z^T with the residual columns for the gradient.
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda

from kernels import classify as kc
from kernels.arrays import as_device_array, is_device_array
from kernels.gemv import gemv
from kernels.softmax import softmax

from .. import api
from .features import GRAY_WEIGHTS, scale_of

NAME = "cuda"
BLOCK = 256
MAX_FUSED_CLASSES = 16
SIMULATOR = bool(config.ENABLE_CUDASIM)
config.CUDA_LOW_OCCUPANCY_WARNINGS = False

_WB, _WG, _WR = GRAY_WEIGHTS  # float32 scalars: the gray plane's weights


def padded_width(features: int) -> int:
    """Columns of the device feature matrix: features, the bias column, zero padding."""
    return (features + 1 + 3) // 4 * 4


def _grid(n: int) -> int:
    return max(1, (n + BLOCK - 1) // BLOCK)


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
            kc.prepare3[_grid(h * w), BLOCK](dimg, scale, _WB, _WG, _WR, planes, gray)
        else:
            kc.prepare1[_grid(h * w), BLOCK](dimg, scale, planes)
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
        kc.put[_grid(n * k), BLOCK](src, X, col, np.float32(scale))

    def put_hypot(self, X, col: int, gx, gy) -> None:
        n = X.shape[0]
        kc.put_hypot[_grid(n), BLOCK](gx.reshape(n), gy.reshape(n), X, col)

    def finish(self, X):
        kc.put_tail[_grid(X.shape[0]), BLOCK](X, self.features)
        self.device_image = None
        return X


def gather(X, index: np.ndarray, features: int) -> np.ndarray:
    """Rows `index` (first `features` columns) of the device matrix, on the host."""
    n = int(index.shape[0])
    out = cuda.device_array((n, features), np.float32)
    if n:
        kc.gather_rows[_grid(n * features), BLOCK](X, cuda.to_device(index.astype(np.int64)), out)
    return out.copy_to_host()


# ------------------------------------------------------------------------------ classify


def weight_rows(W: np.ndarray, b: np.ndarray, width: int) -> np.ndarray:
    """(C, Fa) float32: each class's weights, its bias in the ones column, zeros."""
    C, F = W.shape
    rows = np.zeros((C, width), np.float32)
    rows[:, :F] = W
    rows[:, F] = b
    return rows


def column(a, c: int):
    """Column c of a 2-D device array `a` (positive strides): a strided 1-D view, in O(1).

    Not `a[:, c]`: for a non-contiguous view, numba-cuda's DeviceNDArray.__getitem__
    (0.30.4: `_do_getitem` -> dummyarray's `iter_contiguous_extent`) loops in Python over
    every element, one extent each: ~13 s for a column of 8.3 M rows (a 4K image), which
    made predict take 26 s. This builds the view Numba would build (same shape, stride
    and memory extent, the parent's allocation kept alive by the view of its gpu_data)
    without that loop. On the simulator the array wraps a NumPy array, whose column
    slice is O(1); it is wrapped as the simulator's own __getitem__ wraps one."""
    n, cols = (int(s) for s in a.shape)
    if not 0 <= c < cols:
        raise IndexError(f"column {c} of an array with {cols} columns")
    if SIMULATOR:
        return type(a)(a._ary[:, c], stream=a.stream)
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    s0, s1 = (int(s) for s in a.strides)
    lo = c * s1
    hi = lo + (n - 1) * s0 + a.dtype.itemsize if n else lo
    return DeviceNDArray(
        shape=(n,), strides=(s0,), dtype=a.dtype, stream=a.stream, gpu_data=a.gpu_data.view(lo, hi)
    )


def logits(X, dW):
    """(P, C) device logits: column c is gemv(X, dW[c]) (written through `column`)."""
    C = dW.shape[0]
    out = cuda.device_array((X.shape[0], C), np.float32)
    for c in range(C):
        gemv(X, dW[c], out=column(out, c))
    return out


def relative_rows(rows: np.ndarray) -> np.ndarray:
    """Each class's weight row minus the last class's, for the C - 1 first classes.

    softmax(z) = softmax(z - z_last), so logits relative to the last class give the same
    probabilities with one GEMV (one pass over X) fewer: 2 instead of 3 for 3 classes."""
    rows = np.asarray(rows, np.float64)
    return (rows[:-1] - rows[-1]).astype(np.float32)


def logits_relative(X, dWrel):
    """(P, C) device logits relative to the last class: C - 1 GEMVs (each written into
    its column through `column`), a zero last column."""
    n, Cm1 = X.shape[0], dWrel.shape[0]
    out = cuda.device_array((n, Cm1 + 1), np.float32)
    for c in range(Cm1):
        gemv(X, dWrel[c], out=column(out, c))
    kc.zero_column[_grid(n), BLOCK](out, Cm1)
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
    kc.argmax_rows[_grid(dprobs.shape[0]), BLOCK](dprobs, _lut(dprobs.shape[1], lut), out)
    return out


def fused(X, dW, lut=None):
    """(probabilities (P, C), lut[class index] (P,)) from one kernel (method 'fused')."""
    C = dW.shape[0]
    n, width = X.shape
    if C > MAX_FUSED_CLASSES or width > 64:
        raise ValueError("method 'fused' handles up to 16 classes and 63 features")
    probs = cuda.device_array((n, C), np.float32)
    index = cuda.device_array(n, np.uint8)
    blocks = max(1, (n + kc.FUSED_ROWS - 1) // kc.FUSED_ROWS)
    kc.fused_kernel(C, width)[blocks, kc.FUSED_ROWS](X, dW, _lut(C, lut), probs, index)
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
