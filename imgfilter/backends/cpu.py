"""The CPU backend: OpenCV where it computes our semantics exactly, NumPy and Numba loops
elsewhere.

Host arrays only. See `imgfilter.backends` for the contract shared with the CUDA
backend. What a command that filters one image needs is OpenCV and NumPy alone: it
imports no Numba and compiles nothing (a first use from empty caches is as fast as the
next). Numba (`cpu_loops`, compiled loops cached on disk) is imported only for the
direct sums (`correlate`'s direct32 and direct64 paths) and, once loaded, for
`contour`'s fused pass. Borders cv2 cannot apply itself (wrap; a constant border with
a non-zero value) are padded by index maps (`cpu_common.padded`), and cv2 filters the
padded image, whose middle is the result.

correlate (`correlate_plan` says which path a call takes):
- kernels below `direct_area_limit` taps (130; uint16 50): cv2.filter2D itself. There
  OpenCV correlates directly (no DFT), taps in row-major order with float32 fused
  multiply-adds: the semantics by definition (integer kernels on integer images are
  exact; float kernels round as OpenCV rounds).
- from the limit (where cv2.filter2D switches to a DFT, whose uint8 results differ by
  1 LSB now and then), the promise is the direct float64 correlation: non-zero taps
  in row-major order from 0, multiply then add, then round half to even and saturate
  (integers) or round to float32. Four ways to it:
  - separable: kernels equal to a sum of r outer products within 1e-6 of |K|_1
    (`low_rank`, SVD; taken when r * (kh + kw) <= taps / 2) are filtered as r
    cv2.sepFilter2D passes, summed (float32 for uint8 images, where the bound below
    opens about 0.2% of the outputs; else float64). For integer outputs each value
    comes with a rigorous bound on its distance from the direct result (|E|_1 * max|x|
    plus rounding of both summations); where an output within that bound could round
    differently, it is recomputed by the direct sum (`_direct_at`), so integer
    outputs are bit-equal to the direct path. float32 outputs are stored from the
    passes: within (|E|_1 + ~1e-15 |K|_1) * max|x| of the direct result (images with
    inf or NaN take the direct sums).
  - fft (full rank, where a cost model expects it faster than the direct loops, Numba's
    import and load counted while it is not loaded; with Numba loaded, on a 2495x2167
    image from about 15x15 for uint8, 17x17 for float32; finite float32 images only):
    overlap-save tiles (`cpu_fft`), float64 cv2.dft tiles for integer images,
    numpy.fft tiles for float32 ones. Every output's distance from the direct sum is
    bounded (a normwise FFT error model, 16 u per radix-2 stage plus the twiddles'
    error, and the direct sum's own rounding, doubled); where a value within that
    bound could round or saturate differently, the direct float64 sum is computed
    (NumPy, or a compiled loop once Numba is loaded) and stored: bit-equal to the
    direct path. Integer outputs are almost never open; float32 outputs, whose
    rounding steps scale with the value, about 1-3% (near zero, mostly).
  - direct32 (uint8, full rank, bound < `_DIRECT32_BOUND`): float32 FMAs, twice the
    SIMD width of float64, with the same bound-and-recompute check: bit-equal.
  - direct64 (otherwise): the float64 direct sums themselves.
  The direct loops (Numba) run four taps per pass over a chunk of 512 accumulators: the
  same operations in the same order as one tap at a time.
- box: integer images go to cv2.blur (its running sums are exact integers; its
  scaling is the semantics: uint8 boxes up to 256 pixels in 23-bit fixed point,
  others in float32 in its SIMD body and double in its scalar tail), except the
  2-pixel uint8 box: cv2.blur's scalar tail stores (255 + 255 + 2) >> 1 = 256 as 0
  there, so exact sums (cv2.boxFilter, normalize=False, int32) go through OpenCV's
  fixed point here, (s + 2) >> 1, saturated. cv2.blur runs on one thread; images from
  8 MiB go to it in bands of rows, one thread each, one such call at a time
  (`_in_row_bands`): exact sums make every band's values those of one call.
  float32 images: float64 sums that never subtract, so huge, inf or NaN values reach
  only the boxes that hold them (cv2.blur's double running sums carry them along the
  row): `cpu_box`, in NumPy.
- contour: gray as cv2.cvtColor (`bgr_to_gray`), four integer responses, saturated,
  OR-ed: bit-exact, in one fused Numba pass (`cpu_loops._contour_rows`) once Numba is
  loaded in the process; before that, through OpenCV (cvtColor, four cv2.filter2D:
  integer taps on integer pixels are exact float32 sums; cv2.bitwise_or), which is
  1.6x slower warm but spares a command that filters one image Numba's import and
  cache load (0.4-0.5 s).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections.abc import Iterator

import numpy as np

from kernels.common import border_index as _bi
from kernels.common.saturate import output_limits

from .cpu_common import U32, U64, axis_map, direct_sums, padded, run_parallel, threads

NAME = "cpu"


def direct_area_limit(dtype) -> int:
    """Kernel area from which cv2.filter2D stops using its float32 direct path.

    Below it OpenCV accumulates taps in row-major order with fused multiply-adds in
    float32 (the SIMD body). From it, OpenCV 5's results equal a float64 correlation
    for uint16 and float32 images (checked on random data), and come from a DFT for
    uint8 (close to the float64 result, not always equal). The limits are OpenCV's
    DFT switch-over: 130 taps for uint8 and float32, 50 for uint16.
    """
    return 50 if np.dtype(dtype) == np.uint16 else 130


_DIRECT32_BOUND = 0.05  # float32 FMAs when at most ~10% of the outputs fall back
_COST_TAP = {"direct32": 0.085e-9, "direct64": 0.12e-9}  # per tap and output (see cpu_fft)
# Seconds a process pays to import Numba and load the direct loops from its cache
# before its first direct sum (the FFT tiles need neither): the cost model adds it to
# the direct paths while Numba is not loaded.
_COST_NUMBA_LOAD = 0.5


# OpenCV's border constants for the modes cv2 applies itself (wrap and a constant
# border with a non-zero value are padded here first).
_CV_BORDER = {_bi.REFLECT101: 4, _bi.REFLECT: 2, _bi.REPLICATE: 1, _bi.CONSTANT: 0}


def _cv_plan(img, kh, kw, anchor, border, value):
    """(source, borderType, crop): what to hand cv2 so that it sees our border.

    cv2 applies reflect101, reflect, replicate and a zero constant border itself
    (crop None). Otherwise the image is padded here (`padded`, our index maps) and
    cv2 filters the padded image; the output is its crop (top, left)."""
    h, w, c = img.shape
    if border in _CV_BORDER and (border != _bi.CONSTANT or value == 0):
        return (img.reshape(h, w) if c == 1 else img), _CV_BORDER[border], None
    ay, ax = anchor
    pad = padded(img, ay, kh - 1 - ay, ax, kw - 1 - ax, border, value, img.dtype)
    pad = pad.reshape(pad.shape[0], -1, c)
    return (pad[:, :, 0] if c == 1 else pad), 4, (ay, ax)


def _cv_dst(out, crop):
    """The array cv2 may write into directly (out as cv2 shapes it), or None."""
    if crop is not None:
        return None
    h, w, c = out.shape
    return out.reshape(h, w) if c == 1 else out


def _cv_finish(res, crop, out, dst=None):
    """Copy cv2's result (cropped when padded) into `out` (H, W, C) unless cv2 wrote
    it there already."""
    h, w, c = out.shape
    if dst is not None and res is dst:
        return out
    if crop is not None:
        res = res[crop[0] : crop[0] + h, crop[1] : crop[1] + w]
    out.reshape(h, w, c)[...] = res.reshape(h, w, c)
    return out


def low_rank(kernel64: np.ndarray, max_rank: int, rel: float = 1e-6):
    """(u (r, kh), v (r, kw), |E|_1) with kernel = sum_r outer(u[r], v[r]) + E and
    |E|_1 <= rel * |kernel|_1, for the smallest such r <= max_rank; None if none."""
    if max_rank < 1:
        return None
    uu, s, vt = np.linalg.svd(kernel64)
    l1 = float(np.abs(kernel64).sum())
    for r in range(1, min(max_rank, s.shape[0]) + 1):
        u = (uu[:, :r] * s[:r]).T.copy()
        v = vt[:r].copy()
        err = float(np.abs(kernel64 - u.T @ v).sum())
        if err <= rel * l1:
            return u, v, err
    return None


def _magnitude(img, value) -> float:
    """An upper bound of |x| over the padded image (inf when it holds inf or NaN)."""
    if img.dtype.kind == "u":
        return float(max(np.iinfo(img.dtype).max, abs(value)))
    top = float(img.max(initial=-np.inf))  # NaN propagates through max and min
    m = max(top, -float(img.min(initial=np.inf)), abs(float(value)))
    return m if math.isfinite(m) else math.inf


def correlate_plan(img, kernel, value, fft=None):
    """(path, params): how `correlate` filters `img` with `kernel` (see the module
    docstring): ("opencv", None), ("separable", (u, v, bound)), ("fft", (th, tw)),
    ("direct32", bound) or ("direct64", None).

    fft None: the FFT tiles where the cost model (`fft_tile_shape`, `_COST_TAP`)
    expects them faster than the direct loops; True: whenever they apply (a kernel
    from the limit that is not of low rank; float32 images finite and below
    `cpu_fft.FFT_F32_MAX`); False: never. While Numba is not loaded, the direct paths'
    modelled time includes its import and load (`_COST_NUMBA_LOAD`)."""
    return _plan(img, kernel, value, fft)[:2]


def _plan(img, kernel, value, fft):
    """`correlate_plan`'s (path, params) and the image's magnitude (`_magnitude`;
    0.0 when the path does not need it)."""
    h, w, c = img.shape
    kh, kw = kernel.shape
    if kh * kw < direct_area_limit(img.dtype):
        return "opencv", None, 0.0
    weights = np.asarray(kernel, np.float32)
    k64 = weights.astype(np.float64)
    ntaps = int(np.count_nonzero(k64))
    l1 = float(np.abs(k64).sum())
    mag = _magnitude(img, value)
    _, _, is_int = output_limits(img.dtype)
    if not (math.isfinite(mag) and ntaps):
        return "direct64", None, mag
    plan = low_rank(k64, ntaps // (2 * (kh + kw)))
    if plan is not None:
        u, v, err = plan
        rank = u.shape[0]
        uv = float((np.abs(u).sum(axis=1) * np.abs(v).sum(axis=1)).sum())
        # |separable - exact| <= (|E|_1 + rounding of E and of the passes) * max|x|;
        # |direct float64 - exact| <= (ntaps + 2) * 2 u64 * |K|_1 * max|x|.
        rounding = (rank + 2) * (l1 + uv) + (kh + kw + rank + 2) * uv + (ntaps + 2) * l1
        bound = 1.5 * mag * (err + 2 * U64 * rounding) if is_int else -1.0
        if img.dtype == np.uint8:
            # float32 passes: kernels rounded to float32 (2 u32 |u||v|), kw then kh
            # float32 sums, rank float32 adds: (kh + kw + rank + 4) u32 |u|_1 |v|_1.
            bound32 = 1.25 * mag * (err + (kh + kw + rank + 4) * U32 * uv + 2 * U64 * rounding)
            if bound32 < _DIRECT32_BOUND:
                return "separable", (u, v, bound32, np.float32), mag
        return "separable", (u, v, bound, np.float64), mag
    direct = ("direct64", None)
    if img.dtype == np.uint8:
        # float32 FMAs: |error| <= (ntaps + 1) * u32 * (1 + ntaps * u32) * |K|_1 * max|x|
        bound = 1.5 * mag * l1 * ((ntaps + 1) * U32 * (1 + ntaps * U32) + (ntaps + 2) * U64)
        if bound < _DIRECT32_BOUND:
            direct = ("direct32", bound)
    from .cpu_fft import FFT_F32_MAX, fft_tile_shape

    if fft is False or not (is_int or mag < FFT_F32_MAX):
        return *direct, mag
    loaded = _numba_loaded()
    th, tw, seconds = fft_tile_shape(kh, kw, h, w, 0 if is_int else kh * kw, loaded)
    load = 0.0 if loaded else _COST_NUMBA_LOAD
    if fft or seconds < _COST_TAP[direct[0]] * ntaps * h * w + load:
        return "fft", (th, tw), mag
    return *direct, mag


def _taps(weights, rowlen, nch):
    """(offs, ws): the non-zero taps in row-major order, as offsets into the flattened
    padded image (rows of `rowlen` values, `nch` channels) and float32 weights."""
    ii, jj = np.nonzero(weights)
    return (ii * rowlen + jj * nch).astype(np.int64), weights[ii, jj].copy()


def correlate(img, kernel, anchor, border, value, method, out=None, stream=None, *, fft=None):
    """cv2.filter2D semantics; `method` and `stream` are ignored (no GPU); the result
    is written into `out` when given. See the module docstring for the paths; `fft`
    as in `correlate_plan` (None: the cost model decides)."""
    h, w, c = img.shape
    kh, kw = kernel.shape
    ay, ax = anchor
    out = np.empty_like(img) if out is None else out
    weights = np.ascontiguousarray(kernel, dtype=np.float32)
    path, params, mag = _plan(img, weights, value, fft)
    if path == "opencv":
        import cv2

        src, cvb, crop = _cv_plan(img, kh, kw, anchor, border, value)
        dst = _cv_dst(out, crop)
        res = cv2.filter2D(src, -1, weights, dst=dst, anchor=(ax, ay), borderType=cvb)
        return _cv_finish(res, crop, out, dst)
    lo, hi, is_int = output_limits(img.dtype)
    if path == "fft":
        from .cpu_fft import correlate_fft

        return correlate_fft(img, weights, anchor, border, value, params, out, lo, hi, mag)
    if path == "separable":
        return _separable(img, weights, anchor, border, value, params, out)
    from . import cpu_loops as loops  # Numba, on first need

    pad = padded(img, ay, kh - 1 - ay, ax, kw - 1 - ax, border, value, np.float32)
    rowlen = pad.shape[1]
    offs, ws = _taps(weights, rowlen, c)
    flat = pad.reshape(-1)
    out2 = out.reshape(h, w * c)
    if path == "direct32":
        loops._direct_rows(flat, rowlen, offs, ws, out2, lo, hi, is_int, False, params)
    else:
        loops._direct_rows(flat, rowlen, offs, ws, out2, lo, hi, is_int, True, -1.0)
    return out


def _separable(img, weights, anchor, border, value, params, out):
    """The separable path: sum_r cv2.sepFilter2D(img, depth, v[r], u[r]) (each output a
    sum of its window's products in `depth`: float32 for uint8 images, whose bound
    then opens ~0.2% of the outputs, else float64; in bands of rows on several
    threads), in order of r; then integer outputs whose value within `bound` could
    round or saturate differently take the direct float64 sum (`_direct_at`); float32
    outputs are stored as computed."""
    import cv2

    u, v, bound, depth = params
    cv_depth = cv2.CV_32F if depth == np.float32 else cv2.CV_64F
    h, w, c = img.shape
    kh, kw = weights.shape
    ay, ax = anchor
    src, cvb, crop = _cv_plan(img, kh, kw, anchor, border, value)

    def passes(part):
        acc = None
        for r in range(u.shape[0]):
            res = cv2.sepFilter2D(part, cv_depth, v[r], u[r], anchor=(ax, ay), borderType=cvb)
            acc = res if acc is None else np.add(acc, res, out=acc)
        return acc

    acc = np.empty((h, w, c), depth)
    if not _in_row_bands(passes, src, crop, ay, kh - 1 - ay, acc):
        _cv_finish(passes(src), crop, acc)
    lo, hi, is_int = output_limits(img.dtype)
    if not is_int:
        out[...] = acc
        return out
    # |acc - rint(acc)| is exact in acc's own precision; where it is within bound of
    # 0.5 (the threshold rounded down to acc's precision) the direct sum decides
    # (saturated outputs among them included: harmless). Rows in chunks on threads.
    thr = np.asarray(0.5 - bound, depth)
    if thr > 0.5 - bound:
        thr = np.nextafter(thr, depth(0))
    acc2, out2 = acc.reshape(h, -1), out.reshape(h, -1)
    chunks = min(h, 4 * threads())
    edges = [h * i // chunks for i in range(chunks + 1)]
    opened: list = [None] * chunks

    def check(i: int) -> None:
        y0, y1 = edges[i], edges[i + 1]
        near = np.rint(acc2[y0:y1])
        np.clip(near, lo, hi, out=out2[y0:y1], casting="unsafe")  # integers: exact
        np.subtract(acc2[y0:y1], near, out=near)
        np.abs(near, out=near)
        opened[i] = np.flatnonzero(near >= thr) + y0 * acc2.shape[1]

    run_parallel(check, chunks, threads())
    index = np.concatenate(opened)
    if index.size:
        _direct_at(img, weights, anchor, border, value, index, out)
    return out


def _direct_at(img, weights, anchor, border, value, index, out) -> None:
    """out (H, W, C, integer) at flat positions `index` = the direct float64 sums
    (`cpu_common.direct_sums`) rounded half to even and saturated; in parts on
    threads."""
    h, w, c = img.shape
    kh, kw = weights.shape
    ay, ax = anchor
    lo, hi, _ = output_limits(img.dtype)
    pad = padded(img, ay, kh - 1 - ay, ax, kw - 1 - ax, border, value, img.dtype)
    flat, rowlen = pad.reshape(-1), pad.shape[1]
    k64 = weights.astype(np.float64)
    parts = np.array_split(index, max(1, min(index.size // 4096, threads())))

    def part(i: int) -> None:
        y, xc = np.divmod(parts[i], w * c)
        sums = direct_sums(flat, y * rowlen + xc, rowlen, c, k64)
        out.reshape(-1)[parts[i]] = np.clip(np.rint(sums), lo, hi)

    run_parallel(part, len(parts), threads())


# cv2.blur runs on one thread (OpenCV's box filter has no parallel loop), so integer
# boxes are filtered in bands of rows, a thread each, one band per BAND_BYTES of
# output at most: a thread costs about 0.1 ms to start, a band of 4 MiB 1-3 ms of work.
BAND_BYTES = 4 << 20
_BAND_MIN_ROWS = 16
# One call in bands at a time: callers that filter at once (a Dask worker's threads, a
# pipeline's) keep the CPUs busy already, and bands on top would only add threads.
_banding = threading.Lock()


class _Unbanded(threading.local):
    on = False


_unbanded = _Unbanded()


@contextlib.contextmanager
def unbanded() -> Iterator[None]:
    """Filters in this block, on this thread, run without row bands: for a thread whose
    CPUs are all busy with other images (a many-files pipeline's codec thread), where
    band threads would only wait for a CPU and make that thread wait for them."""
    _unbanded.on = True
    try:
        yield
    finally:
        _unbanded.on = False


def band_threads() -> int:
    """Threads for `_in_row_bands`: OpenCV's own count (cv2.setNumThreads)."""
    import cv2

    return cv2.getNumThreads()


def _in_row_bands(fn, src, crop, top, bottom, out) -> bool:
    """Fill `out` (H, W, C) with fn(src) (its crop at `crop` = (row, column) when `src`
    is padded; `src` as cv2 shapes it, (H', W') for one channel) computed in bands of
    rows, each band given with the `top` rows above and `bottom` rows below it that its
    kernel reads, on `band_threads()` threads. Equal to one call for filters whose
    every output is a function of its window's values alone, wherever the rows start
    (cv2.blur of integer images: exact integer sums): inner bands never read their
    border, and the first and last ones, at least top + bottom + 1 rows, end where the
    image does and hold every row the border rule reflects there. As many bands as
    `band_threads()`, one per BAND_BYTES of `out`, and one per that many rows allow;
    False, with nothing done, where that is fewer than 2 or another call is filtering in
    bands (one call then), or the thread is in `unbanded`."""
    if _unbanded.on:
        return False
    h, w, _ = out.shape
    rows = max(_BAND_MIN_ROWS, top + bottom + 1)
    nbands = min(out.nbytes // BAND_BYTES, h // rows)
    if nbands >= 2:  # only then ask cv2 (its call lets go of the GIL)
        nbands = min(nbands, band_threads())
    if nbands < 2 or not _banding.acquire(blocking=False):
        return False
    try:
        _run_bands(fn, src, crop, top, bottom, out, nbands)
    finally:
        _banding.release()
    return True


def _run_bands(fn, src, crop, top, bottom, out, nbands: int) -> None:
    """`_in_row_bands`' work: nbands bands, the calling thread filtering the first."""
    h, w, _ = out.shape
    r0, c0 = crop if crop is not None else (0, 0)
    dst = out.reshape(h, w) if src.ndim == 2 else out
    edges = [h * i // nbands for i in range(nbands + 1)]
    errors: list[BaseException] = []

    def band(i: int) -> None:
        try:
            y0, y1 = edges[i] + r0, edges[i + 1] + r0  # rows of src
            a, b = max(0, y0 - top), min(src.shape[0], y1 + bottom)
            dst[y0 - r0 : y1 - r0] = fn(src[a:b])[y0 - a : y1 - a, c0 : c0 + w]
        except BaseException as e:  # noqa: BLE001 - raised in the calling thread
            errors.append(e)

    # Plain threads: concurrent.futures would cost a command 5-10 ms to import.
    threads = [threading.Thread(target=band, args=(i,)) for i in range(1, nbands)]
    for t in threads:
        t.start()
    band(0)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def box(img, ksize, anchor, border, value, method, out=None, stream=None):
    """cv2.blur semantics (exact sums, OpenCV's scaling); `method` and `stream` are
    ignored; the result is written into `out` when given. See the module docstring."""
    h, w, c = img.shape
    kh, kw = ksize
    ay, ax = anchor
    out = np.empty_like(img) if out is None else out
    lo, hi, is_int = output_limits(img.dtype)
    if not is_int:
        from .cpu_box import box_float

        return box_float(img, ksize, anchor, border, value, out)
    import cv2

    src, cvb, crop = _cv_plan(img, kh, kw, anchor, border, value)
    if not (img.dtype == np.uint8 and kh * kw == 2):

        def blur(part, dst=None):
            return cv2.blur(part, (kw, kh), dst=dst, anchor=(ax, ay), borderType=cvb)

        if _in_row_bands(blur, src, crop, ay, kh - 1 - ay, out):
            return out
        dst = _cv_dst(out, crop)
        return _cv_finish(blur(src, dst), crop, out, dst)
    # cv2.blur's fixed point for 2 pixels, ((s + 2) * 2**22) >> 23, saturated (its
    # scalar tail stores 256 as 0 here)
    sums = cv2.boxFilter(src, cv2.CV_32S, (kw, kh), anchor=(ax, ay), normalize=False,
                         borderType=cvb)  # fmt: skip
    if crop is not None:
        sums = sums[crop[0] : crop[0] + h, crop[1] : crop[1] + w]
    out.reshape(h, w, c)[...] = np.minimum((sums + 2) >> 1, hi).reshape(h, w, c)
    return out


# One call in Numba's parallel contour pass at a time: Numba's default threading layer
# must not be entered from several threads at once, so a call that finds it taken
# (another thread of a pipeline or a list) goes through OpenCV, with the same result.
_numba_pass = threading.Lock()


_U8, _U16 = np.dtype(np.uint8), np.dtype(np.uint16)
# Lists of images (`box_list`, `correlate_list`, `contour_list`) go over threads a
# chunk of consecutive images at a time, LIST_CHUNKS chunks a thread (images differ in
# size), on no more threads than can run at once: an image's OpenCV calls hold the GIL
# a few microseconds each (their arguments, their results, our code around them) and
# run without it in proportion to the image's bytes, so past 1 + (mean image bytes) /
# GIL_BYTES threads they would queue for the GIL, and a queue makes CPython force
# switches between threads (a round trip each: more threads, slower). GIL_BYTES: what
# a box or a small filter goes through while its call holds the GIL (cv2.blur: ~4 us
# held, 0.75 ns a byte; a 3x3 cv2.filter2D with our plan around it: ~9 us, 2.2 ns a
# byte); a contour makes eight calls (gray, four filters, three ORs: ~30 us) and takes
# 2.8 ns a byte: CONTOUR_GIL_BYTES. And one thread per LIST_BYTES of images at most:
# a thread costs about 0.1 ms to start.
LIST_CHUNKS = 4
GIL_BYTES = 5 << 10
CONTOUR_GIL_BYTES = 11 << 10
LIST_BYTES = 1 << 18


def each_image(call, n: int, nbytes: int, gil_bytes: int = GIL_BYTES) -> list:
    """[call(i) for i in range(n)], the images i (holding `nbytes` in all) in chunks of
    consecutive ones over up to `threads()` threads, no more than 1 + nbytes / n /
    `gil_bytes` and one per LIST_BYTES (see above). The calls must release the GIL
    (OpenCV, NumPy) to run at once; the first error is raised once every thread has
    stopped."""
    results: list = [None] * n
    if not n:
        return results
    gil_bound = 1 + nbytes // (n * gil_bytes)
    workers = max(1, min(threads(), n, nbytes // LIST_BYTES, gil_bound))
    chunks = min(n, workers * LIST_CHUNKS)
    edges = [n * i // chunks for i in range(chunks + 1)]

    def chunk(j: int) -> None:
        for i in range(edges[j], edges[j + 1]):
            results[i] = call(i)

    run_parallel(chunk, chunks, workers)
    return results


def box_list(imgs, ksize, anchor, border, values, method, outs=None, stream=None) -> list:
    """`box` of each (H, W, C) image of `imgs` (`values`: each one's border value,
    `outs`: None or each one's (H, W, C) out), over threads (`each_image`); returns the
    results (H, W, C). An integer image that `box` would give to one cv2.blur call as
    it is (a border cv2 applies, not the 2-pixel uint8 box, too small for bands) goes
    to that call here directly, the others through `box`."""
    import cv2

    kh, kw = ksize
    ay, ax = anchor
    size, at, cvb = (kw, kh), (ax, ay), _CV_BORDER.get(border)
    # the dtypes cv2.blur computes as `box` does; uint8's 2-pixel box: see `box`
    direct = set() if cvb is None else {_U16} if kh * kw == 2 else {_U8, _U16}
    constant = border == _bi.CONSTANT  # cv2 applies a zero constant border alone
    whole = 2 * BAND_BYTES  # smaller images are never filtered in bands

    def one(i: int):
        img, out = imgs[i], None if outs is None else outs[i]
        if img.dtype not in direct or img.nbytes >= whole or (constant and values[i]):
            return box(img, ksize, anchor, border, values[i], method, out)
        h, w, c = img.shape
        if c != 1 and out is None:
            return cv2.blur(img, size, None, at, cvb)
        src, dst = img, out
        if c == 1:  # as cv2 shapes one channel
            src, dst = img.reshape(h, w), None if out is None else out.reshape(h, w)
        res = cv2.blur(src, size, dst, at, cvb)
        if out is None:
            return res.reshape(h, w, 1)
        if res is not dst:
            dst[...] = res
        return out

    return each_image(one, len(imgs), sum(img.nbytes for img in imgs))


def correlate_list(imgs, kernel, anchor, border, values, method, outs=None, stream=None) -> list:
    """`correlate` of each (H, W, C) image of `imgs` (`values`, `outs` as `box_list`'s);
    returns the results (H, W, C). Over threads (`each_image`) when every image goes to
    one cv2.filter2D call (a kernel below `direct_area_limit` taps for its dtype), else
    one image at a time, each call spreading its own work (the compiled loops must not
    be entered from several threads at once)."""
    kh, kw = kernel.shape

    def one(i: int):
        out = None if outs is None else outs[i]
        return correlate(imgs[i], kernel, anchor, border, values[i], method, out)

    if all(kh * kw < direct_area_limit(dt) for dt in {img.dtype for img in imgs}):
        return each_image(one, len(imgs), sum(img.nbytes for img in imgs))
    return [one(i) for i in range(len(imgs))]


def contour_list(imgs, border, values, method, outs=None, stream=None) -> list:
    """`contour` of each (H, W, C) image of `imgs` (`values`, `outs` as `box_list`'s;
    outs (H, W)) over threads (`each_image`); returns the results (H, W)."""

    def one(i: int):
        out = None if outs is None else outs[i]
        return contour(imgs[i], border, values[i], method, out)

    return each_image(one, len(imgs), sum(img.nbytes for img in imgs), CONTOUR_GIL_BYTES)


def contour(img, border, value, method, out=None, stream=None):
    """Gray, four 3x3 edge responses, saturated, OR-ed; (H, W) out, written into `out`
    when given; `method` and `stream` are ignored. Integer images (the array API
    refuses float ones). Numba's fused pass if Numba is loaded and no other thread is
    in it, else OpenCV's calls: callers on several threads at once are safe."""
    if not _numba_loaded() or not _numba_pass.acquire(blocking=False):
        return _contour_opencv(img, border, value, out)
    try:
        from . import cpu_loops as loops

        h, w, _ = img.shape
        _, hi, _ = output_limits(img.dtype)
        rows = axis_map(h, 1, 1, border)
        cols = axis_map(w, 1, 1, border)
        gray = np.empty((h + 2, w + 2), np.int64)
        loops._gray_padded(img, rows, cols, int(value), gray)
        out = np.empty((h, w), img.dtype) if out is None else out
        loops._contour_rows(gray, hi, out)
        return out
    finally:
        _numba_pass.release()


def _numba_loaded() -> bool:
    return "numba" in sys.modules


def _contour_opencv(img, border, value, out):
    """`contour` as OpenCV computes its definition: cv2.cvtColor, four cv2.filter2D of
    the gray image (borders cv2 cannot apply padded first, `_cv_plan`), cv2.bitwise_or."""
    import cv2

    from .opencv import CONTOUR_KERNELS

    h, w, c = img.shape
    if c == 1:
        gray = img.reshape(h, w)
    else:
        gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY if c == 3 else cv2.COLOR_BGRA2GRAY)
    src, cv_border, crop = _cv_plan(gray.reshape(h, w, 1), 3, 3, (1, 1), border, value)
    res = None
    for k in CONTOUR_KERNELS:
        edge = cv2.filter2D(src, -1, k, anchor=(1, 1), borderType=cv_border)
        res = edge if res is None else cv2.bitwise_or(res, edge, dst=res)
    if crop is not None:
        res = res[1 : 1 + h, 1 : 1 + w]
    if out is None:
        return np.ascontiguousarray(res)
    out[...] = res
    return out
