"""The CPU backend's FFT path: overlap-save tiles, bit-equal to the direct float64 sums.

`correlate_fft` filters each channel of the image, extended by the border's index
maps (`Source`: the padded plane is never built), in tiles: a tile of th x tw padded
pixels gives (th - kh + 1) x (tw - kw + 1) outputs, which its cyclic correlation with
the kernel holds without wrap-around. Every output comes with a rigorous bound on its
distance from the direct float64 sum (the FFT's error model plus the direct sum's
own rounding, doubled); where a value within that bound could store differently, the
direct float64 sum itself is computed from the tile's pixels and stored (`_redo`). So
the result is bit-equal to the direct path; the FFT only decides the outputs whose
rounding it pins.

Two engines, one per output type:
- integer images: float64 cv2.dft tiles (packed CCS), the kernel's spectrum from
  exact-twiddle matrix products (`kernel_spectrum`). cv2.dft builds its twiddles by a
  recurrence whose error grows with the length (`twiddle_error`), so the bound
  (`fft_error_factor`) is loose, but integer outputs only need it below the distance
  to a tie: almost never open.
- float32 images: numpy.fft tiles (pocketfft, whose twiddles are cos/sin of exact
  angle multiples: within `_MU_NUMPY` of exact), the kernel's spectrum by the same
  rfft2, and a bound in ||K||_2 instead of max|K_hat| (`F32Bound`): float32 rounding
  steps scale with the value, so about 1% of the outputs (those near zero, mostly)
  are open and recomputed.

Threads: `cpu_common.threads()` Python threads take tiles in turn; cv2.dft, numpy.fft
and the NumPy loads and stores release the GIL. NumPy and OpenCV alone: a process that
filters one image compiles and loads nothing (the Numba loads and stores this path
used took 2-7 s to compile on a first use, and ~0.5 s to import and load from Numba's
cache in every later process). Only the recompute of open outputs (`_redo`) takes the
compiled loop `cpu_loops.direct_dense`, 15x faster, in a process that has loaded Numba.
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np

from .cpu_common import U64 as _U64
from .cpu_common import axis_map, direct_sums, run_parallel, threads

_FFT_STAGE = 16.0  # assumed normwise error of one radix-2 stage of an FFT, in u64
_MU_NUMPY = 10.0  # error of pocketfft's twiddles, in u64 (`F32Bound`)
_FFT_MAX = 384  # largest tile side (a tile and the kernel's spectrum stay in L2)
_FFT_SIDES = tuple(
    sorted(
        n
        for n in {2**a * 3**b * 5**c for a in range(1, 10) for b in range(6) for c in range(4)}
        if n <= _FFT_MAX
    )
)  # even sizes whose DFT has radix-2, 3 and 5 stages only
_NP_SIDES = tuple(n for n in _FFT_SIDES if n % 5)  # numpy.fft's radix-5 passes cost ~15% more
# single-thread cost model (seconds, measured on a 2-core Xeon; only ratios matter)
_COST_FFT_LOG = 0.8e-9  # dft, idft and the product, per tile pixel and log2(tile size)
_COST_FFT_PX = 3e-9  # loading, bound and store, per tile pixel
_COST_FFT_TILE = 25e-6  # Python and call overhead per tile
# float32 images (numpy.fft tiles, about 2% of the outputs recomputed), fitted to
# tiles of 96 to 384 pixels a side and kernels of 13 to 31 on a 2495x2167 image:
_COST_NP_FFT = 1.7  # numpy.fft tiles cost this many times the above per pixel
_COST_NP_TILE = 110e-6  # Python and call overhead per tile
_COST_REDO_CALL = 3.6e-6  # the direct recompute's NumPy calls, per tap and tile
_COST_REDO_TAP = 3e-9  # the direct recompute, per tap of an open output
_COST_REDO_TAP_NUMBA = 0.18e-9  # the same compiled (`cpu_loops.direct_dense`), no calls
_OPEN_F32 = 3.5e-6  # share of float32 outputs open, per sqrt(n) log2(n) of an n-pixel tile
FFT_F32_MAX = 1e150  # float32 images take the FFT below this magnitude (finite squares)


def fft_tile_shape(kh: int, kw: int, h: int, w: int, redo_taps: int = 0, compiled=False):
    """(th, tw, seconds): the tile (even sides from `_FFT_SIDES`) that minimises the
    modelled single-thread time of overlap-save tiles for one (h, w) channel.

    A tile of th x tw padded pixels gives (th - kh + 1) x (tw - kw + 1) outputs; no
    tile side exceeds the smallest size that covers the padded image. redo_taps > 0
    (float32 outputs, numpy.fft tiles: sides from `_NP_SIDES`): the bound leaves a
    share of the outputs open that grows with the tile (~1.5% at 256 x 256 on random
    data), each recomputed at that many taps, by NumPy or, `compiled`, by Numba."""
    best = (0, 0, math.inf)
    hp, wp = h + kh - 1, w + kw - 1
    sides = _NP_SIDES if redo_taps else _FFT_SIDES
    engine = _COST_NP_FFT if redo_taps else 1.0
    per_tile = _COST_NP_TILE + redo_taps * _COST_REDO_CALL if redo_taps else _COST_FFT_TILE
    per_tap = _COST_REDO_TAP
    if compiled:
        per_tile, per_tap = min(per_tile, _COST_NP_TILE), _COST_REDO_TAP_NUMBA
    rows = [t for t in sides if t >= kh and (t < hp or t == _cover(hp, sides))]
    cols = [t for t in sides if t >= kw and (t < wp or t == _cover(wp, sides))]
    for th in rows:
        ny = -(-h // (th - kh + 1))
        for tw in cols:
            n = th * tw
            tiles = ny * -(-w // (tw - kw + 1))
            per_px = _COST_FFT_LOG * math.log2(n) + _COST_FFT_PX
            redo = _OPEN_F32 * math.sqrt(n) * math.log2(n) * redo_taps * per_tap
            t = tiles * (n * per_px * engine + per_tile) + h * w * redo
            if t < best[2]:
                best = (th, tw, t)
    return best


def _cover(n: int, sides: tuple) -> int:
    """The smallest of `sides` >= n (the largest one when none is)."""
    return next((t for t in sides if t >= n), sides[-1])


# ---------------------------------------------------------- loads, recompute


class Source:
    """An (H, W, C) image extended by a border, as padded planes that are never built:
    `rows` / `cols` (`cpu_common.axis_map`) give the source row / column of each padded
    one (-1: the constant `value`, rounded to float32 as the direct path pads it)."""

    def __init__(self, img, top, bottom, left, right, border, value):
        h, w, _ = img.shape
        self.img = img
        self.rows = axis_map(h, top, bottom, border)
        self.cols = axis_map(w, left, right, border)
        self.row_run = (top, top + h)  # padded rows that are image rows 0 .. h - 1
        self.col_run = (left, left + w)
        self.value = float(np.float32(value))

    def load(self, oy, ox, keep, sumsq):
        """keep[c, r, q] = the padded channel c at (oy + r, ox + q) as float64, zero
        beyond the padded image; sumsq[c] = the sum of squares of keep[c] (non-negative
        terms: within 1e-9 of exact for any tile; callers scale it by 1.001). Finite
        images only."""
        _, th, tw = keep.shape
        rows = self.rows[oy : oy + th]
        cols = self.cols[ox : ox + tw]
        nrow, ncol = rows.shape[0], cols.shape[0]
        part = _take(self.img, 0, rows, oy, self.row_run)
        part = _take(part, 1, cols, ox, self.col_run)
        view = keep[:, :nrow, :ncol]
        view[...] = part.transpose(2, 0, 1)
        if rows[0] < 0 or rows[-1] < 0:
            view[:, rows < 0] = self.value
        if cols[0] < 0 or cols[-1] < 0:
            view[:, :, cols < 0] = self.value
        keep[:, nrow:] = 0.0
        keep[:, :nrow, ncol:] = 0.0
        sumsq[:] = np.einsum("crq,crq->c", view, view)


def _take(a, axis, index, first, run):
    """a's entries index (-1 read as 0) along axis: a slice where the padded positions
    first .. first + len(index) - 1 lie inside `run` (the image's own), else a gather."""
    n = index.shape[0]
    if run[0] <= first and first + n <= run[1]:
        start = int(index[0])
        return a[start : start + n] if axis == 0 else a[:, start : start + n]
    return np.take(a, np.maximum(index, 0), axis=axis)


def _redo(dst, y0, x0, opened, plane, k64, lo, hi, is_int) -> None:
    """dst[y0 + y, x0 + x] = the direct float64 sum of the output whose window starts
    at (y, x) of `plane` (float64), for the offsets y * rowlen + x in `opened`;
    rounded half to even and saturated to [lo, hi] (is_int), else rounded to float32.
    The sums: `cpu_common.direct_sums` (NumPy, ~3 ns a tap), or its compiled twin
    `cpu_loops.direct_dense` (~0.2 ns a tap) in a process that has loaded Numba."""
    if opened.size == 0:
        return
    rowlen = plane.shape[1]
    if "numba" in sys.modules:
        from .cpu_loops import direct_dense

        sums = np.empty(opened.shape[0])
        direct_dense(plane.reshape(-1), opened, rowlen, k64, sums)
    else:
        sums = direct_sums(plane.reshape(-1), opened, rowlen, 1, k64)
    y, x = np.divmod(opened, rowlen)
    dst[y0 + y, x0 + x] = np.clip(np.rint(sums), lo, hi) if is_int else sums


def _each_tile(tasks, start):
    """Run start() once per thread, giving a function tile, then tile(*task) for
    every task, on `threads()` threads (one: this one)."""
    tiles: dict[int, object] = {}

    def one(i: int) -> None:
        key = threading.get_ident()
        if key not in tiles:
            tiles[key] = start()
        tiles[key](*tasks[i])

    run_parallel(one, len(tasks), threads())


# ------------------------------------------------ integer images: cv2.dft tiles


def _twiddles(n: int, k: int, half: bool) -> np.ndarray:
    """(n or n//2 + 1, k) complex exp(-2 pi i f j / n); f j reduced mod n exactly and
    the angle taken in [-pi, pi], so each entry is within 10 u64 of the true one."""
    f = np.arange(n // 2 + 1 if half else n)[:, None]
    m = (f * np.arange(k)[None, :]) % n
    m = np.where(m > n // 2, m - n, m)
    return np.exp((-2.0 * np.pi / n) * m * 1j)


def kernel_spectrum(k64: np.ndarray, th: int, tw: int) -> tuple[np.ndarray, float, float]:
    """(spec, beta, kappa): the DFT of the kernel zero-padded to th x tw, columns
    0 .. tw/2 (what numpy.fft.rfft2 gives), a bound beta on each entry's error, and
    kappa >= the largest modulus of the exact spectrum (the computed one's plus beta).

    Computed as two matrix products with accurate twiddles (not by an FFT), so the
    error is elementwise: |error| <= beta = 1.01 (2 mu + sqrt(2) (kh + kw + 4) u) |K|_1
    with mu = 10 u the twiddles' error. The products are plain loops
    (`_spectrum_products`), not BLAS: a multithreaded BLAS call leaves its threads
    spinning for a while, which halves the throughput of the tiles that follow."""
    kh, kw = k64.shape
    spec = _spectrum_products(_twiddles(th, kh, False), k64, _twiddles(tw, kw, True))
    l1 = float(np.abs(k64).sum())
    beta = 1.01 * (20.0 + math.sqrt(2.0) * (kh + kw + 4)) * _U64 * l1
    return spec, beta, float(np.abs(spec).max()) + beta


def _spectrum_products(a, k64, b):
    """a (th, kh) @ (k64 (kh, kw) @ b.T (kw, nb)), complex, each entry a plain sum of
    products (np.einsum's own loops: a multithreaded BLAS call would leave its threads
    spinning for a while, which halves the throughput of the tiles that follow)."""
    m = np.einsum("it,jt->ij", k64.astype(np.complex128), b, optimize=False)
    return np.einsum("it,tj->ij", a, m, optimize=False)


def ccs_packed(spec: np.ndarray, th: int, tw: int) -> np.ndarray:
    """`kernel_spectrum`'s spec (th, tw/2 + 1) in OpenCV's packed CCS layout: what
    cv2.dft gives for a real th x tw input (th, tw even)."""
    ccs = np.empty((th, tw))
    ccs[:, 1 : tw - 1 : 2] = spec[:, 1 : tw // 2].real
    ccs[:, 2 : tw - 1 : 2] = spec[:, 1 : tw // 2].imag
    for col, f in ((0, 0), (tw - 1, tw // 2)):
        c = spec[: th // 2 + 1, f]
        ccs[0, col] = c[0].real
        ccs[1 : th - 1 : 2, col] = c[1 : th // 2].real
        ccs[2 : th - 1 : 2, col] = c[1 : th // 2].imag
        ccs[th - 1, col] = c[th // 2].real
    return ccs


def twiddle_error(th: int, tw: int) -> float:
    """mu: a bound on the error of the twiddle factors cv2.dft uses for th x tw. It
    builds them by a recurrence, w_(i+1) = w_i w_1 (dxt.cpp, DFTInit), whose error
    grows by at most |dw_1| + sqrt(2) gamma_2 < 4 u a step, over up to n / 2 steps:
    2 max(th, tw) u."""
    return 2.0 * max(th, tw) * _U64


def fft_error_factor(kappa: float, beta: float, n: int, mu: float = 0.0) -> float:
    """F with |y_fft - y| <= ||x_tile||_2 * F for every output of one tile of n pixels.

    y_fft = idft(dft(x) * conj(K)) in float64 (a real-input FFT, a complex product,
    the inverse with its 1/n), y the exact correlation. Model: each transform has
    normwise relative error eps <= log2(n) (16 u + mu) (Higham, Accuracy and
    Stability, Thm 24.2: a radix-2 stage contributes mu + gamma_4 (sqrt 2 + mu), ~6 u
    + mu; 16 u per radix-2 equivalent leaves a margin for radix-3/4/5 and real-input
    passes; mu is the twiddles' error, `twiddle_error`); the kernel's spectrum is
    within beta of exact per entry and at most kappa in modulus (`kernel_spectrum`);
    a complex product adds sqrt(2) gamma_2. Then with X = dft(x), ||X||_2 = sqrt(n)
    ||x||_2, the spectrum's error is ||dX|| kappa + ||X|| beta + ||X|| kappa 2.83 u (and
    cross terms), the inverse divides by sqrt(n) and adds eps + u of its input's
    norm, and an output's error is at most the 2-norm of all of them.
    """
    eps = math.log2(n) * (_FFT_STAGE * _U64 + mu)
    a = eps * kappa + (1 + eps) * beta + (1 + eps) * (kappa + beta) * 2.83 * _U64
    return 1.01 * (a + (eps + _U64) * (kappa + a))


def _store_int_tile(res, dst, oy, ox, bound, lo, hi, rowlen, near):
    """dst[oy + r, ox + q] = res[r, q] rounded and saturated (integer dst), for the
    part of res that dst holds from (oy, ox); returns the offsets r * rowlen + q (in
    the tile, rows of `rowlen`) of the outputs where a value within `bound` of
    res[r, q] could round differently (it reaches a tie, distance 0.5 from rint,
    exact in float64; saturated ones among them: harmless), whose direct sums the
    caller stores. bound 0 means an all-zero tile (direct sums 0). `near` is float64
    scratch at least as large as res."""
    rows = min(res.shape[0], dst.shape[0] - oy)
    n = min(res.shape[1], dst.shape[1] - ox)
    part = dst[oy : oy + rows, ox : ox + n]
    if bound == 0.0:
        part[...] = 0
        return _NONE
    v = res[:rows, :n]
    d = near[:rows, :n]
    np.rint(v, out=d)
    np.clip(d, lo, hi, out=part, casting="unsafe")  # integers in [lo, hi]: exact
    np.subtract(v, d, out=d)
    np.abs(d, out=d)
    opened = d >= 0.5 - bound
    if not opened.any():
        return _NONE
    r, q = np.nonzero(opened)
    return r * rowlen + q


_NONE = np.empty(0, np.int64)


def _tile_transform(spec, th, tw):
    """transform(buf): buf (th, tw) float64 -> its correlation with the kernel whose
    half spectrum is spec, in place (rows 0 .. th - kh, columns 0 .. tw - kw valid):
    cv2.dft (packed CCS), mulSpectrums with the conjugate, cv2.idft with DFT_SCALE."""
    import cv2

    ccs = ccs_packed(spec, th, tw)
    flags = cv2.DFT_REAL_OUTPUT | cv2.DFT_SCALE

    def transform(buf):
        cv2.dft(buf, buf)
        cv2.mulSpectrums(buf, ccs, 0, buf, conjB=True)
        cv2.idft(buf, buf, flags)

    return transform


def _int_tiles(source, k64, tile, outs, lo, hi, ntaps, mag):
    """start() for `_each_tile`: integer outputs by cv2.dft tiles (`_tile_transform`).

    The bound is 2 (||x_tile||_2 F + (taps + 2) u |K|_1 mag): the FFT's error
    (`fft_error_factor`) plus the direct float64 sum's own distance from the exact
    correlation (mag >= every |pixel|)."""
    kh, kw = k64.shape
    th, tw = tile
    sh, sw = th - kh + 1, tw - kw + 1
    spec, beta, kappa = kernel_spectrum(k64, th, tw)
    transform = _tile_transform(spec, th, tw)
    factor = 1.001 * fft_error_factor(kappa, beta, th * tw, twiddle_error(th, tw))
    direct = (ntaps + 2) * _U64 * float(np.abs(k64).sum()) * mag
    nch = len(outs)

    def start():
        buf = np.empty((th, tw))
        keep = np.empty((nch, th, tw))
        sumsq = np.empty(nch)
        near = np.empty((sh, sw))

        def tile(oy, ox):
            source.load(oy, ox, keep, sumsq)
            for c in range(nch):
                bound = 0.0
                buf[...] = keep[c]
                if sumsq[c] > 0.0:  # else an all-zero tile: direct sums 0, no transform
                    bound = 2.0 * (math.sqrt(1.001 * sumsq[c]) * factor + direct)
                    transform(buf)
                out = outs[c]
                opened = _store_int_tile(buf[:sh, :sw], out, oy, ox, bound, lo, hi, tw, near)
                _redo(out, oy, ox, opened, keep[c], k64, lo, hi, True)

        return tile

    return start


# ---------------------------------------------- float32 images: numpy.fft tiles


class F32Bound:
    """The float32 engine's bound: |y_fft - S| <= 2 (a ||x||_2 + d ||Z||_2 + e mag)
    for each output of a tile x, S its direct float64 sum, Z the computed half
    spectrum of the product (`_spectrum_product`), mag >= every |pixel|.

    Model (the integer engine's, `fft_error_factor`): each transform has normwise
    relative error eps = log2(n) (16 u + mu) with mu = `_MU_NUMPY` u: numpy's
    pocketfft takes each twiddle as the product of two table entries, cos and sin of
    exact multiples of 2 pi / n, so within a few u of exact. Over the full spectrum
    (sqrt 2 times a half spectrum's norm), with X = dft(x), ||X|| = sqrt(n) ||x||,
    and Kh the kernel's computed spectrum (the same rfft2, so ||dKh|| <= sqrt 2 eps
    sqrt(n) ||K||_2), an output of the exact inverse of the computed product is off
    by at most (1/n) sum_f |dZ_f| <= (1/n) ||dZ||_2 sqrt(n) (Cauchy-Schwarz):
    forward error, spectrum error and product rounding (sqrt 2 gamma_2 per entry) give
    a = sqrt 2 (2 eps + 3 u)(1 + 2 eps) ||K||_2; the inverse adds at most its normwise
    error (eps + 2 u) ||Z_full||_2 / sqrt(n): d = sqrt 2 (eps + 2 u) / sqrt(n)
    (irfft drops the imaginary parts of self-conjugate bins: a projection, no larger
    error). e = (taps + 2) u |K|_1 bounds the direct sum's own distance from the exact
    correlation. All times 1.01, then doubled as a margin."""

    def __init__(self, k64: np.ndarray, th: int, tw: int, ntaps: int, mag: float):
        n = th * tw
        eps = math.log2(n) * (_FFT_STAGE + _MU_NUMPY) * _U64
        k2 = float(np.sqrt(np.square(k64).sum()))
        self.a = 1.01 * math.sqrt(2.0) * (2 * eps + 3 * _U64) * (1 + 2 * eps) * k2
        self.d = 1.01 * math.sqrt(2.0) * (eps + 2 * _U64) / math.sqrt(n)
        self.e = 1.01 * (ntaps + 2) * _U64 * float(np.abs(k64).sum()) * mag

    def __call__(self, sumsq: float, zsq: float) -> float:
        """The bound for a tile whose sum of squares is `sumsq`, its spectrum's `zsq`."""
        return 2.0 * (self.a * math.sqrt(1.001 * sumsq) + self.d * math.sqrt(1.001 * zsq)
                      + self.e)  # fmt: skip


def _spectrum_product(z, kc):
    """z *= kc (complex, elementwise); returns the sum of |z|^2 afterwards (non-negative
    terms, in any order: `F32Bound` scales it by 1.001)."""
    z *= kc
    parts = z.view(np.float64)
    return float(np.einsum("ij,ij->", parts, parts))


def _np_transform(kc, th, tw, sh):
    """transform(buf, z) -> sum |Z|^2: buf (th, tw) float64 becomes its correlation
    with the kernel whose conjugated half spectrum is kc (rows 0 .. sh - 1 written;
    columns 0 .. tw - kw valid), through z (th, tw // 2 + 1) complex scratch."""
    fft = np.fft
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":  # the out= arguments

        def transform(buf, z):
            fft.rfft(buf, axis=1, out=z)
            fft.fft(z, axis=0, out=z)
            zsq = _spectrum_product(z, kc)
            fft.ifft(z, axis=0, out=z)
            fft.irfft(z[:sh], n=tw, axis=1, out=buf[:sh])
            return zsq

        return transform

    def transform(buf, z):
        z[...] = fft.fft(fft.rfft(buf, axis=1), axis=0)
        zsq = _spectrum_product(z, kc)
        buf[:sh] = fft.irfft(fft.ifft(z, axis=0)[:sh], n=tw, axis=1)
        return zsq

    return transform


def _store_f32_tile(res, dst, oy, ox, bound, rowlen):
    """dst[oy + r, ox + q] = float32(res[r, q]) for the part of res that dst holds
    from (oy, ox); returns the offsets r * rowlen + q (in the tile, rows of `rowlen`)
    of the outputs where a value within `bound` of res[r, q] could round to another
    float32, whose direct sums the caller stores."""
    rows = min(res.shape[0], dst.shape[0] - oy)
    n = min(res.shape[1], dst.shape[1] - ox)
    v = res[:rows, :n]
    below = (v - bound).astype(np.float32)
    dst[oy : oy + rows, ox : ox + n] = below
    r, q = np.nonzero(below != (v + bound).astype(np.float32))
    return r * rowlen + q


def _f32_tiles(source, k64, tile, outs, ntaps, mag):
    """start() for `_each_tile`: float32 outputs by numpy.fft tiles (`_np_transform`),
    checked against `F32Bound`."""
    kh, kw = k64.shape
    th, tw = tile
    sh, sw = th - kh + 1, tw - kw + 1
    kc = np.conj(np.fft.rfft2(k64, s=(th, tw)))
    transform = _np_transform(kc, th, tw, sh)
    bound_of = F32Bound(k64, th, tw, ntaps, mag)
    nch = len(outs)

    def start():
        buf = np.empty((th, tw))
        keep = np.empty((nch, th, tw))
        sumsq = np.empty(nch)
        z = np.empty((th, tw // 2 + 1), np.complex128)

        def tile(oy, ox):
            source.load(oy, ox, keep, sumsq)
            for c in range(nch):
                if sumsq[c] == 0.0:  # an all-zero tile: direct sums +0, no transform
                    buf[...] = 0.0
                    bound = 0.0
                else:
                    buf[...] = keep[c]
                    bound = bound_of(sumsq[c], transform(buf, z))
                opened = _store_f32_tile(buf[:sh, :sw], outs[c], oy, ox, bound, tw)
                _redo(outs[c], oy, ox, opened, keep[c], k64, 0, 0, False)

        return tile

    return start


# ------------------------------------------------------------------------ entry


def correlate_fft(img, weights, anchor, border, value, tile, out, lo, hi, mag):
    """out (H, W, C) = the direct float64 correlation of img with the float32 kernel
    `weights`, rounded as out's dtype rounds, by FFT tiles of `tile` = (th, tw).

    Integer images (lo, hi: the output's range) take cv2.dft tiles, float32 images
    numpy.fft tiles (finite, below `FFT_F32_MAX`); mag >= |x| for every pixel and the
    border value. See the module docstring."""
    h, w, c = img.shape
    kh, kw = weights.shape
    ay, ax = anchor
    source = Source(img, ay, kh - 1 - ay, ax, kw - 1 - ax, border, value)
    outs = [out[:, :, i] for i in range(c)]
    ntaps = int(np.count_nonzero(weights))
    k64 = weights.astype(np.float64)
    if img.dtype == np.float32:
        start = _f32_tiles(source, k64, tile, outs, ntaps, mag)
    else:
        start = _int_tiles(source, k64, tile, outs, lo, hi, ntaps, mag)
    sh, sw = tile[0] - kh + 1, tile[1] - kw + 1
    tasks = [(oy, ox) for oy in range(0, h, sh) for ox in range(0, w, sw)]
    _each_tile(tasks, start)
    return out
