"""The pixel classifier's CUDA engine: features, logits and probabilities on the GPU.

Features come from the CUDA backend's filters (device arrays in, device arrays out)
and are assembled by small kernels (`kernels.classify`) into one (P, Fa) float32
matrix, P pixels by Fa = the F features, a column of ones (the bias) and zero columns
up to a multiple of 4 (so every row is 16-byte aligned for GEMV's 128-bit loads).

Classification (`predict`), as issue 6 asks: the logits of class c are one GEMV,
`kernels.linalg.gemv.gemv(X, [W_c - W_last, b_c - b_last, 0...])`, written into column c of a
(P, C) logits matrix (through `column`, an O(1) strided view) whose last column is
zero (softmax does not change when a row's logits all shift by the same amount, so
C - 1 GEMVs suffice); `kernels.softmax.softmax` turns each row into probabilities; a
last kernel takes each row's argmax.
`predict(..., method="fused")` is the alternative measured by
benchmarks/classify_bench.py: one kernel reads each pixel's features once and writes
its C probabilities and label (it reads X once instead of C - 1 times).

Streams (issue 23): every launch, filter, GEMV, softmax and copy of one feature
computation or one prediction is queued on one stream (`FeatureEngine(stream)`,
`predict_device(..., stream=)`: a stream object or CUstream handle, else the device
image's or matrix's own stream, else the legacy default stream), through
kernels.common.launch.launch, and nothing waits for the GPU until a result is copied to the
host. Arrays come from kernels.common.devarray's stream-ordered pool, so the temporaries of
a call can be dropped as soon as their launches are queued.

Training (`TrainEngine`): the labelled rows' standardised features Z (n, Fa) and Z^T
stay on the device; each evaluation runs C GEMVs for the logits, the log-softmax
kernel, and C GEMVs of Z^T with the residual columns for the gradient.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from kernels.common.arrays import (
    SIMULATOR,
    as_device_array,
    empty,
    is_device_array,
    resolve_stream,
    to_device,
    to_host,
)
from kernels.common.devarray import DeviceArray
from kernels.common.launch import launch
from kernels.common.refs import KernelRef
from kernels.conv.plan import tiled_fits
from kernels.linalg.gemv import gemv
from kernels.softmax import softmax

from .. import api
from .features import GRAY_WEIGHTS, contour_source, scale_of

NAME = "cuda"
BLOCK = 256
MAX_FUSED_CLASSES = 16

_WB, _WG, _WR = GRAY_WEIGHTS  # float32 scalars: the gray plane's weights


def padded_width(features: int) -> int:
    """Columns of the device feature matrix: features, the bias column, zero padding."""
    return (features + 1 + 3) // 4 * 4


@functools.cache
def _kernel(name: str) -> KernelRef:
    """Kernel `name` of `kernels.classify`, by name: launched from its shipped cubin
    without importing Numba where one ships (`kernels.common.refs`)."""
    return KernelRef("kernels.classify", name)


def _grid(n: int) -> int:
    return max(1, (n + BLOCK - 1) // BLOCK)


def _softmax(x, log: bool, stream: int):
    return as_device_array(softmax(x, log=log, stream=stream))


# ------------------------------------------------------------------------------ features


class FeatureEngine:
    """Feature matrix (P, Fa) float32 on the device (see the module docstring).

    stream: where every launch goes (a stream object or CUstream handle); None: the
    device image's own stream (its `__cuda_array_interface__`), else the legacy
    default stream. Nothing here waits for the GPU.
    """

    def __init__(self, stream: Any = None) -> None:
        self.device_image = None
        self._stream_arg = stream
        self.stream = resolve_stream(stream)

    def prepare(self, img, ch: int):
        """Upload the image (a device image is used in place) and scale it to float32."""
        h, w = img.shape[:2]
        if is_device_array(img):
            dimg = as_device_array(img)
            self.stream = s = resolve_stream(self._stream_arg, dimg)
            dimg = dimg.reshape(h, w, -1)
        else:
            s = self.stream
            dimg = to_device(np.ascontiguousarray(img.reshape(h, w, -1)), s)
        self.device_image = dimg
        planes = empty((h, w, ch), np.float32, s)
        scale = scale_of(dimg.dtype)
        if ch == 3:
            gray = empty((h, w, 1), np.float32, s)
            args = (dimg, scale, _WB, _WG, _WR, planes, gray)
            launch(_kernel("prepare3"), _grid(h * w), BLOCK, args, s)
        else:
            launch(_kernel("prepare1"), _grid(h * w), BLOCK, (dimg, scale, planes), s)
            gray = planes
        return planes, gray

    def filter2d(self, a, kernel: np.ndarray):
        # The feature kernels are 1-D Gaussians and 3x3 Sobels on float32 planes: the
        # shared-memory kernel takes any size as an argument (one compile for all),
        # where `auto`'s register-blocked kernel is generated and compiled per size
        # (~8 s each, most of a first `train`), for no gain at these sizes.
        method = "tiled" if tiled_fits(*kernel.shape) else "auto"
        return api.filter2d(a, kernel, backend="cuda", method=method, stream=self.stream)

    def blur(self, a, k: int):
        return api.blur(a, k, backend="cuda", stream=self.stream)

    def contour_source(self, img):
        """(the integer image the contour feature is computed from, its scale): the
        device image itself for integer images; for float32 ones, its 8-bit rounding
        (on the device for a device image, as features.contour_source on the host)."""
        dimg = self.device_image
        if not is_device_array(img):
            return contour_source(img)
        if np.dtype(dimg.dtype).kind == "u":
            return dimg, scale_of(dimg.dtype)
        q = empty(dimg.shape, np.uint8, self.stream)
        n = int(dimg.size)
        args = (dimg.reshape(n), q.reshape(n))
        launch(_kernel("quantize_u8"), _grid(n), BLOCK, args, self.stream)
        return q, scale_of(np.uint8)

    def contour(self, u):
        dimg = self.device_image
        if is_device_array(u):
            dimg = u
        elif dimg is None or np.dtype(dimg.dtype) != u.dtype:
            dimg = to_device(np.ascontiguousarray(u), self.stream)
        return api.contour(dimg, backend="cuda", stream=self.stream)

    def matrix(self, pixels: int, features: int):
        self.features = features
        return empty((pixels, padded_width(features)), np.float32, self.stream)

    def put(self, X, col: int, a, scale) -> None:
        a = as_device_array(a)
        n = X.shape[0]
        k = 1 if a.ndim == 2 else a.shape[2]
        src = a.reshape(n, k)
        launch(_kernel("put"), _grid(n * k), BLOCK, (src, X, col, np.float32(scale)), self.stream)

    def put_hypot(self, X, col: int, gx, gy) -> None:
        n = X.shape[0]
        gx, gy = as_device_array(gx).reshape(n), as_device_array(gy).reshape(n)
        launch(_kernel("put_hypot"), _grid(n), BLOCK, (gx, gy, X, col), self.stream)

    def finish(self, X):
        launch(_kernel("put_tail"), _grid(X.shape[0]), BLOCK, (X, self.features), self.stream)
        self.device_image = None
        return X


def gather(X, index: np.ndarray, features: int, stream: Any = None) -> np.ndarray:
    """Rows `index` (first `features` columns) of the device matrix, on the host."""
    s = resolve_stream(stream, X)
    n = int(index.shape[0])
    out = empty((n, features), np.float32, s)
    if n:
        dindex = to_device(index.astype(np.int64), s)
        launch(_kernel("gather_rows"), _grid(n * features), BLOCK, (X, dindex, out), s)
    return to_host(out, s)


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
    made predict take 26 s. On a GPU this is a kernels.common.devarray.DeviceArray of the
    column (the parent kept alive as its owner); on the simulator the array wraps a
    NumPy array, whose column slice is O(1); it is wrapped as the simulator's own
    __getitem__ wraps one."""
    n, cols = (int(s) for s in a.shape)
    if not 0 <= c < cols:
        raise IndexError(f"column {c} of an array with {cols} columns")
    if SIMULATOR:
        return type(a)(a._ary[:, c], stream=a.stream)
    a = as_device_array(a)
    s0, s1 = a.strides
    return DeviceArray(a.ptr + c * s1, (n,), a.dtype, (s0,), a.stream, a)


def row(a, r: int):
    """Row r of a C-contiguous 2-D device array as a 1-D view (both array kinds)."""
    return a[r : r + 1].reshape(a.shape[1])


def logits(X, dW, stream: Any = None):
    """(P, C) device logits: column c is gemv(X, dW[c]) (written through `column`)."""
    s = resolve_stream(stream, X)
    C = dW.shape[0]
    out = empty((X.shape[0], C), np.float32, s)
    for c in range(C):
        gemv(X, row(dW, c), out=column(out, c), stream=s)
    return out


def relative_rows(rows: np.ndarray) -> np.ndarray:
    """Each class's weight row minus the last class's, for the C - 1 first classes.

    softmax(z) = softmax(z - z_last), so logits relative to the last class give the same
    probabilities with one GEMV (one pass over X) fewer: 2 instead of 3 for 3 classes."""
    rows = np.asarray(rows, np.float64)
    return (rows[:-1] - rows[-1]).astype(np.float32)


def logits_relative(X, dWrel, stream: Any = None):
    """(P, C) device logits relative to the last class: C - 1 GEMVs (each written into
    its column through `column`), a zero last column."""
    s = resolve_stream(stream, X)
    n, Cm1 = X.shape[0], dWrel.shape[0]
    out = empty((n, Cm1 + 1), np.float32, s)
    for c in range(Cm1):
        gemv(X, row(dWrel, c), out=column(out, c), stream=s)
    launch(_kernel("zero_column"), _grid(n), BLOCK, (out, Cm1), s)
    return out


def probabilities(dlogits, stream: Any = None):
    return _softmax(dlogits, False, resolve_stream(stream, dlogits))


def _lut(classes: int, lut, stream: int):
    if lut is None:
        lut = np.arange(classes, dtype=np.uint8)
    return to_device(np.ascontiguousarray(lut, dtype=np.uint8), stream)


def argmax(dprobs, lut=None, stream: Any = None):
    """(P,) uint8 device array: lut[argmax of each row] (lut None: the index itself)."""
    s = resolve_stream(stream, dprobs)
    n = dprobs.shape[0]
    out = empty((n,), np.uint8, s)
    launch(_kernel("argmax_rows"), _grid(n), BLOCK, (dprobs, _lut(dprobs.shape[1], lut, s), out), s)
    return out


def fused(X, dW, lut=None, stream: Any = None):
    """(probabilities (P, C), lut[class index] (P,)) from one kernel (method 'fused')."""
    s = resolve_stream(stream, X)
    C = dW.shape[0]
    n, width = X.shape
    if C > MAX_FUSED_CLASSES or width > 64:
        raise ValueError("method 'fused' handles up to 16 classes and 63 features")
    from kernels import classify as kc  # Numba

    probs = empty((n, C), np.float32, s)
    index = empty((n,), np.uint8, s)
    blocks = max(1, (n + kc.FUSED_ROWS - 1) // kc.FUSED_ROWS)
    args = (X, dW, _lut(C, lut, s), probs, index)
    launch(kc.fused_kernel(C, width), blocks, kc.FUSED_ROWS, args, s)
    return probs, index


def predict_device(
    X, W: np.ndarray, b: np.ndarray, *, method: str = "gemv", lut=None, stream: Any = None
):
    """(lut[class index] (P,) uint8, probabilities (P, C) float32), both device arrays,
    queued on `stream` (else X's own) without waiting for the GPU. X: the (P, Fa)
    device feature matrix; W (C, F), b (C,): host weights (uploaded on the stream)."""
    X = as_device_array(X)
    s = resolve_stream(stream, X)
    rows = weight_rows(W, b, X.shape[1])
    if method == "fused":
        dprobs, dindex = fused(X, to_device(rows, s), lut, s)
    else:
        # C - 1 GEMVs: logits relative to the last class (see relative_rows).
        dlogits = logits_relative(X, to_device(relative_rows(rows), s), s)
        dprobs = _softmax(dlogits, False, s)
        dindex = argmax(dprobs, lut, s)
    return dindex, dprobs


def predict(
    X, W: np.ndarray, b: np.ndarray, *, proba: bool, method: str = "gemv", lut=None,
    stream: Any = None,
) -> dict:  # fmt: skip
    """ "index": (P,) uint8 lut[class index] (lut None: the index), "proba": (P, C) or
    None, on the host (waits for the stream)."""
    X = as_device_array(X)
    s = resolve_stream(stream, X)
    dindex, dprobs = predict_device(X, W, b, method=method, lut=lut, stream=s)
    return {
        "index": to_host(dindex, s),
        "proba": to_host(dprobs, s) if proba else None,
    }


# ------------------------------------------------------------------------------ training


class TrainEngine:
    """Loss pieces of softmax regression with Z (n, Fa) and Z^T on the device (legacy
    default stream; each evaluation copies its n x C numbers back, so it waits)."""

    def __init__(self, Z: np.ndarray):
        Z = np.ascontiguousarray(Z, dtype=np.float32)
        self.n = Z.shape[0]
        self.dZ = to_device(Z)
        self.dZt = to_device(np.ascontiguousarray(Z.T))

    def log_proba(self, Wa: np.ndarray) -> np.ndarray:
        dW = to_device(np.ascontiguousarray(Wa, dtype=np.float32))
        return to_host(_softmax(logits(self.dZ, dW, 0), True, 0))

    def grad(self, R: np.ndarray) -> np.ndarray:
        """R^T Z (C, Fa): row c is gemv(Z^T, R[:, c])."""
        dR = to_device(np.ascontiguousarray(R.T, dtype=np.float32))
        C = dR.shape[0]
        out = empty((C, self.dZt.shape[0]), np.float32)
        for c in range(C):
            gemv(self.dZt, row(dR, c), out=row(out, c), stream=0)
        return to_host(out)
