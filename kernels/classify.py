"""Device code of the pixel classifier (`imgfilter.classify.cuda` launches it).

Feature assembly into the (P, Fa) float32 matrix (`prepare3`/`prepare1`: scaled colour
planes and gray; `put`, `put_hypot`, `put_tail`: feature columns, gradient magnitudes,
the bias column and zero padding), `gather_rows` (training rows), `zero_column`,
`argmax_rows` (class numbers through a lookup table), `fused_kernel` (logits,
softmax and argmax per pixel in one pass) and `quantize_u8` (a float32 image's 8-bit
contour source). One thread per element or row unless said. All are launched through
kernels.common.launch.launch, on the caller's stream.
"""

from __future__ import annotations

import math
import threading

from numba import cuda, float32, uint8, uint32


@cuda.jit(cache=True)
def prepare3(img, scale, wb, wg, wr, planes, gray):
    """planes = first three channels * scale (float32); gray = wb B + wg G + wr R."""
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
        gray[y, x, 0] = (float32(wb) * b + float32(wg) * g) + float32(wr) * r


@cuda.jit(cache=True)
def prepare1(img, scale, planes):
    i = cuda.grid(1)
    h, w, _ = planes.shape
    if i < h * w:
        y = uint32(i // w)
        x = uint32(i - (i // w) * w)
        planes[y, x, 0] = float32(img[y, x, 0]) * scale


@cuda.jit(cache=True)
def put(src, X, col, scale):
    """X[p, col + j] = src[p, j] * scale for the (P, k) source."""
    i = cuda.grid(1)
    n, k = src.shape
    if i < n * k:
        p = uint32(i // k)
        j = uint32(i - (i // k) * k)
        X[p, uint32(col) + j] = float32(src[p, j]) * scale


@cuda.jit(cache=True)
def put_hypot(gx, gy, X, col):
    p = cuda.grid(1)
    if p < X.shape[0]:
        a = gx[uint32(p)]
        b = gy[uint32(p)]
        X[uint32(p), uint32(col)] = math.sqrt(a * a + b * b)


@cuda.jit(cache=True)
def put_tail(X, col):
    """The bias column (ones) and the zero padding after it."""
    p = cuda.grid(1)
    if p < X.shape[0]:
        X[uint32(p), uint32(col)] = float32(1.0)
        for j in range(col + 1, X.shape[1]):
            X[uint32(p), uint32(j)] = float32(0.0)


@cuda.jit(cache=True)
def gather_rows(X, index, out):
    """out[i, j] = X[index[i], j] for the first out.shape[1] columns."""
    t = cuda.grid(1)
    n, f = out.shape
    if t < n * f:
        i = uint32(t // f)
        j = uint32(t - (t // f) * f)
        out[i, j] = X[uint32(index[i]), j]


@cuda.jit(cache=True)
def argmax_rows(P, lut, out):
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


def _make_fused(classes: int, width: int):
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


@cuda.jit(cache=True)
def zero_column(L, c):
    p = cuda.grid(1)
    if p < L.shape[0]:
        L[uint32(p), uint32(c)] = float32(0.0)


@cuda.jit(cache=True)
def quantize_u8(src, dst):
    """dst = rint(clip(src, 0, 1) * 255) as uint8, NaN as 0, over flat (n,) arrays:
    `imgfilter.classify.features.contour_source` of a float32 image, on the device."""
    i = cuda.grid(1)
    if i < dst.shape[0]:
        v = float32(src[uint32(i)])
        if v != v:
            v = float32(0.0)
        v = min(max(v, float32(0.0)), float32(1.0))
        dst[uint32(i)] = uint8(round(v * float32(255.0)))


_FUSED: dict = {}
_FUSED_LOCK = threading.Lock()


def fused_kernel(classes: int, width: int):
    """The fused kernel for `classes` classes and a `width`-column matrix (kept per
    process; thread-safe)."""
    key = (classes, width)
    kernel = _FUSED.get(key)
    if kernel is None:
        with _FUSED_LOCK:
            kernel = _FUSED.get(key)
            if kernel is None:
                kernel = _FUSED[key] = _make_fused(classes, width)
    return kernel
