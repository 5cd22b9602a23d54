"""The CPU backend's paths against an independent NumPy reference (not OpenCV).

Reference: the image padded as OpenCV's borderInterpolate says (`np_pad`), then the
float64 correlation with the kernel's non-zero taps in row-major order from 0
(multiply, then add): the "direct result" the backend promises for
kernels from `direct_area_limit` taps, rounded half to even and saturated for integer
outputs. Each test checks which path its cases take (`cpu.correlate_plan`), so every
path is reached: cv2.filter2D / cv2.blur delegation, separable passes with the
rounding check, FFT tiles (cv2.dft for integer images, numpy.fft for float32 ones)
with the rounding check, float32 FMAs with the rounding check, float64 direct sums,
the float32 box (sums that never subtract, checked against the reference and
cv2.blur) and the 2-pixel uint8 box.
"""

from __future__ import annotations

import numpy as np
import pytest
from threaded import run_in_threads

from imgfilter.backends import cpu, cpu_common, cpu_fft
from kernels.common import border_index as bi
from kernels.common.saturate import output_limits

BORDERS = {
    bi.REFLECT101: "reflect",
    bi.REFLECT: "symmetric",
    bi.REPLICATE: "edge",
    bi.CONSTANT: "constant",
    bi.WRAP: "wrap",
}


def _source(p, n, border):
    """The row (column) that position p of an axis of n reads: OpenCV's
    borderInterpolate, written out here (np.pad's reflection of pads wider than the
    axis changed between NumPy versions); -1 for the constant border."""
    if 0 <= p < n:
        return p
    if border == bi.CONSTANT:
        return -1
    if border == bi.REPLICATE:
        return 0 if p < 0 else n - 1
    if border == bi.WRAP:
        return p % n
    if n == 1:
        return 0
    delta = 1 if border == bi.REFLECT101 else 0
    while p < 0 or p >= n:
        p = -p - 1 + delta if p < 0 else 2 * n - 1 - p - delta
    return p


def np_pad(img, top, bottom, left, right, border, value):
    h, w = img.shape[:2]
    rows = np.array([_source(p, h, border) for p in range(-top, h + bottom)])
    cols = np.array([_source(p, w, border) for p in range(-left, w + right)])
    out = img[np.clip(rows, 0, None)][:, np.clip(cols, 0, None)]
    out[rows < 0] = value
    out[:, cols < 0] = value
    return out


def reference(img, kernel, anchor, border, value):
    """float64 correlation, taps in row-major order, zero taps skipped, from 0."""
    h, w, _ = img.shape
    kh, kw = kernel.shape
    ay, ax = anchor
    p = np_pad(img.astype(np.float64), ay, kh - 1 - ay, ax, kw - 1 - ax, border, value)
    acc = np.zeros(img.shape, np.float64)
    for i in range(kh):
        for j in range(kw):
            if kernel[i, j] != 0:
                acc = acc + np.float64(kernel[i, j]) * p[i : i + h, j : j + w]
    return acc


def stored(acc, dtype):
    if np.dtype(dtype) == np.float32:
        return acc.astype(np.float32)
    info = np.iinfo(dtype)
    return np.clip(np.rint(acc), info.min, info.max).astype(dtype)


def image(shape, dtype, seed, huge=False):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.float32:
        return (rng.standard_normal(shape) * (1e30 if huge else 100.0)).astype(np.float32)
    return rng.integers(1, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)


def gaussian(k, sigma):
    g = np.exp(-0.5 * ((np.arange(k) - (k - 1) / 2) / sigma) ** 2)
    return np.outer(g / g.sum(), g[::-1] / g.sum() * np.linspace(0.5, 1.5, k))


SHAPES = ((23, 31, 3), (1, 29, 1), (27, 1, 4), (5, 3, 1))


def value_for(border, dtype):
    if border != bi.CONSTANT:
        return 0.0
    return -7.5 if np.dtype(dtype) == np.float32 else 77.0


def run(img, kernel, anchor, border, value, fft=None):
    k = np.asarray(kernel, np.float32)
    return cpu.correlate(img, k, anchor, border, value, "auto", fft=fft)


# ------------------------------------------------------------- large kernels


@pytest.mark.parametrize("border", list(BORDERS))
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32], ids=lambda d: d.__name__)
def test_separable_path_equals_direct(border, dtype):
    """Rank-1 and rank-2 kernels from the limit up: separable passes; integer outputs
    equal the direct float64 result, float32 within the documented bound."""
    k1 = gaussian(13, 2.5).astype(np.float32)
    rng = np.random.default_rng(border)
    k2 = (k1 + np.outer(rng.random(13), rng.random(13) - 0.5) / 169).astype(np.float32)
    for n, (kernel, anchor) in enumerate([(k1, (6, 6)), (k2, (2, 11))]):
        for s, shape in enumerate(SHAPES):
            img = image(shape, dtype, 10 * n + s)
            value = value_for(border, dtype)
            path = cpu.correlate_plan(img, kernel, value)[0]
            assert path == "separable", path
            got = run(img, kernel, anchor, border, value)
            want = reference(img, kernel, anchor, border, value)
            if np.dtype(dtype) == np.float32:
                tol = 1e-6 * float(np.abs(kernel).sum()) * max(abs(value), np.abs(img).max())
                assert np.abs(got - want).max() <= tol
            else:
                np.testing.assert_array_equal(got, stored(want, dtype), f"{shape} {anchor}")


@pytest.mark.parametrize("border", list(BORDERS))
def test_separable_rounding_check_at_exact_ties(border):
    """A 13x13 box of halves over pixels 1 and 3: every sum of 169 odd pixels is an
    exact tie (x.5), where the separable value is not trusted and the direct sum
    decides (half to even)."""
    kernel = np.full((13, 13), 0.5, np.float32)
    img = np.random.default_rng(3).choice([1, 3], (17, 19, 3)).astype(np.uint8)
    value = 3.0 if border == bi.CONSTANT else 0.0
    assert cpu.correlate_plan(img, kernel, value)[0] == "separable"
    got = run(img, kernel, (6, 6), border, value)
    want = reference(img, kernel, (6, 6), border, value)
    assert np.mean((want % 1 == 0.5) & (want < 255)) > 0.5  # ties, not saturated
    np.testing.assert_array_equal(got, stored(want, np.uint8))


def sparse_sign_kernel(shape, seed, scale=2.0**-7):
    """Full-rank kernel of +-scale taps (products exact in float32, sums often ties)."""
    rng = np.random.default_rng(seed)
    k = rng.choice([-1.0, 1.0], shape) * scale
    k[rng.random(shape) < 0.1] = 0.0
    return k.astype(np.float32)


@pytest.mark.parametrize("border", list(BORDERS))
def test_float32_fma_path_with_check_uint8(border):
    """uint8, full-rank kernels >= 130 taps: float32 FMAs, and near-tie outputs
    recomputed in float64: equal to the direct float64 result, ties included."""
    value = value_for(border, np.uint8)
    for n, kshape in enumerate([(13, 13), (11, 17), (21, 21)]):
        kernel = sparse_sign_kernel(kshape, n)
        kernel[kshape[0] // 2, kshape[1] // 2] = 1.0
        anchor = (n % kshape[0], (3 * n) % kshape[1])
        for s, shape in enumerate(SHAPES):
            img = image(shape, np.uint8, 30 + s)
            assert cpu.correlate_plan(img, kernel, value, fft=False)[0] == "direct32"
            got = run(img, kernel, anchor, border, value, fft=False)
            want = reference(img, kernel, anchor, border, value)
            np.testing.assert_array_equal(got, stored(want, np.uint8), f"{kshape} {shape}")
    # a larger image with many exact ties
    img = image((40, 61, 3), np.uint8, 5)
    kernel = sparse_sign_kernel((13, 13), 9, 2.0**-1)
    kernel /= np.float32(8)
    assert cpu.correlate_plan(img, kernel, value, fft=False)[0] == "direct32"
    want = reference(img, kernel, (6, 6), border, value)
    assert np.mean(want % 1 == 0.5) > 0.02
    got = run(img, kernel, (6, 6), border, value, fft=False)
    np.testing.assert_array_equal(got, stored(want, np.uint8))


@pytest.mark.parametrize("border", list(BORDERS))
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32], ids=lambda d: d.__name__)
def test_float64_direct_path(border, dtype):
    """Full-rank kernels from the limit (uint16: 50 taps) with a large |K|_1: float64
    direct sums, equal to the reference bit for bit (float32 outputs too)."""
    value = value_for(border, dtype)
    for n, kshape in enumerate([(7, 8), (12, 11), (1, 131), (131, 1)]):
        if np.dtype(dtype) != np.uint16 and kshape[0] * kshape[1] < 130:
            continue
        rng = np.random.default_rng(n)
        kernel = rng.integers(-3, 4, kshape).astype(np.float32) + np.float32(0.37)
        anchor = (kshape[0] - 1, 0)
        for s, shape in enumerate(SHAPES):
            img = image(shape, dtype, 50 + s)
            assert cpu.correlate_plan(img, kernel, value, fft=False)[0] == "direct64"
            got = run(img, kernel, anchor, border, value, fft=False)
            want = reference(img, kernel, anchor, border, value)
            np.testing.assert_array_equal(got, stored(want, dtype), f"{kshape} {shape}")


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32], ids=lambda d: d.__name__)
def test_separable_path_in_row_bands(dtype, monkeypatch):
    """The separable passes in bands of rows on several threads: integer outputs equal
    the direct float64 result, every output equals one call's, for every border."""
    kernel = gaussian(13, 2.5).astype(np.float32)
    img = image((97, 61, 3), dtype, 70)
    monkeypatch.setattr(cpu, "band_threads", lambda: 3)
    for border in BORDERS:
        value = value_for(border, dtype)
        assert cpu.correlate_plan(img, kernel, value)[0] == "separable"
        with monkeypatch.context() as m:
            m.setattr(cpu, "BAND_BYTES", 1 << 62)
            one = run(img, kernel, (3, 9), border, value)
        monkeypatch.setattr(cpu, "BAND_BYTES", 1)
        got = run(img, kernel, (3, 9), border, value)
        np.testing.assert_array_equal(got, one)
        if np.dtype(dtype) != np.float32:
            want = reference(img, kernel, (3, 9), border, value)
            np.testing.assert_array_equal(got, stored(want, dtype))


def full_rank(k, seed, dtype=np.float32):
    """A random k x k kernel of full rank (normal taps, |K|_1 = 1)."""
    w = np.random.default_rng(seed).standard_normal((k, k))
    return (w / np.abs(w).sum()).astype(dtype)


def fft_run(img, kernel, anchor, border, value, tile=None):
    """The FFT path, with the planned tile or a given (th, tw) (small tiles: many of
    them, so that tile edges and the image's last partial tiles are covered)."""
    k = np.asarray(kernel, np.float32)
    plan = cpu.correlate_plan(img, k, value, fft=True)
    assert plan[0] == "fft", plan
    out = np.empty_like(img)
    lo, hi, _ = output_limits(img.dtype)
    mag = cpu._magnitude(img, value)
    return cpu_fft.correlate_fft(img, k, anchor, border, value, tile or plan[1], out, lo, hi, mag)


FFT_SHAPES = ((37, 53, 3), (1, 45, 1), (41, 1, 4), (70, 33, 1))


@pytest.mark.parametrize("border", list(BORDERS))
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32], ids=lambda d: d.__name__)
def test_fft_path_equals_direct(border, dtype):
    """Full-rank kernels (13x13 .. 41x41; uint16 from 9x9) by FFT tiles: every output
    equal to the direct float64 result, rounded and saturated (integers) or rounded to
    float32, for odd sizes, one row, one column, several tiles and edge tiles."""
    value = value_for(border, dtype)
    sizes = ((9, (16, 18)), (13, (24, 20)), (21, None), (31, (40, 36)), (41, None))
    for n, (k, tile) in enumerate(sizes):
        if k < 13 and np.dtype(dtype) != np.uint16:
            continue
        kernel = full_rank(k, n)
        anchor = (n % k, (5 * n + 3) % k)
        for s, shape in enumerate(FFT_SHAPES):
            img = image(shape, dtype, 200 + 10 * n + s)
            got = fft_run(img, kernel, anchor, border, value, tile)
            want = stored(reference(img, kernel, anchor, border, value), dtype)
            np.testing.assert_array_equal(got, want, f"{k} {shape} {tile}")


@pytest.mark.parametrize("border", list(BORDERS))
def test_fft_path_at_exact_ties_uint8(border):
    """Integer images under kernels of +-1/2 and +-1/4 taps: most sums are exact ties
    (x.5) or within a few ulps of one, where the FFT value is not trusted and the
    direct sum decides (half to even); saturation on both ends included."""
    value = value_for(border, np.uint8)
    rng = np.random.default_rng(border)
    for k, scale, tile in ((13, 0.5, (32, 30)), (21, 0.25, None)):
        signs = np.resize([1.0, -1.0], k * k)  # balanced: sums spread around 0
        kernel = (rng.permutation(signs).reshape(k, k) * scale).astype(np.float32)
        img = image((29, 43, 3), np.uint8, 300 + k)
        want = reference(img, kernel, (k // 2, k // 2), border, value)
        inside = (want > 0) & (want < 255)
        assert np.sum(inside & (want % 1 == 0.5)) > 20 and (want < 0).any() and (want > 255).any()
        got = fft_run(img, kernel, (k // 2, k // 2), border, value, tile)
        np.testing.assert_array_equal(got, stored(want, np.uint8))


def _float32_tie(s):
    """Where s (float64) lies exactly halfway between two adjacent float32 values."""
    f = s.astype(np.float32)
    other = np.nextafter(f, np.where(f > s, -np.inf, np.inf).astype(np.float32))
    return (f != s) & (np.abs(f - s) == np.abs(other.astype(np.float64) - s))


@pytest.mark.parametrize("border", list(BORDERS))
def test_fft_path_at_float32_ties(border):
    """float32 images of small integers and multiples of 2**-24 under a full-rank
    kernel of +-1 taps: the direct sums are exact and many fall halfway between two
    float32 values, where the FFT value cannot decide; the direct sum rounds half to
    even. Zero regions and tiny magnitudes (small float32 steps) included."""
    rng = np.random.default_rng(10 + border)
    value = value_for(border, np.float32)
    k = 13
    kernel = rng.choice([-1.0, 1.0], (k, k)).astype(np.float32)
    ints = rng.choice([-1.0, 1.0], (31, 47, 3)).astype(np.float32)
    tiny = (rng.integers(-40, 41, (31, 47, 3)) * 2.0**-24).astype(np.float32)
    img = np.where(rng.random((31, 47, 3)) < 0.2, ints, tiny).astype(np.float32)
    img[img == 0] = np.float32(2.0**-24)
    img[20:, 30:] = 0.0
    want = reference(img, kernel, (6, 6), border, value)
    assert _float32_tie(want).sum() > 100
    got = fft_run(img, kernel, (6, 6), border, value, (24, 30))
    np.testing.assert_array_equal(got, stored(want, np.float32))


def test_fft_path_zero_tiles_and_constant_border():
    """A zero region (all-zero tiles store 0 without transforms) and a non-zero
    constant border: equal to the direct result."""
    kernel = full_rank(13, 4)
    for dtype, value in ((np.uint16, 77.0), (np.float32, -7.5)):
        img = image((40, 50, 3), dtype, 12)
        img[:, 20:] = 0
        img[5, 40, 1] = 9
        want = reference(img, kernel, (6, 6), bi.CONSTANT, value)
        got = fft_run(img, kernel, (6, 6), bi.CONSTANT, value, (24, 24))
        np.testing.assert_array_equal(got, stored(want, dtype))
        assert (got == 0).mean() > 0.2


def test_fft_kernel_spectrum_and_bound():
    """The kernel's spectrum is cv2.dft's packed CCS layout (within beta), and the
    FFT's observed error on random data is far below the bound the check uses (cv2's
    recurrence twiddles included)."""
    import cv2

    kernel = full_rank(21, 1, np.float64)
    for th, tw in ((48, 40), (64, 270), (30, 24)):
        kp = np.zeros((th, tw))
        kp[:21, :21] = kernel
        spec, beta, kappa = cpu_fft.kernel_spectrum(kernel, th, tw)
        assert np.abs(spec - np.fft.rfft2(kp)).max() <= beta
        assert np.abs(cpu_fft.ccs_packed(spec, th, tw) - cv2.dft(kp)).max() <= beta
        assert kappa >= np.abs(np.fft.fft2(kp)).max()
    x = image((64, 80), np.float32, 5).astype(np.float64)
    exact = sum(kernel[i, j] * x[i : i + 44, j : j + 60] for i in range(21) for j in range(21))
    spec, beta, kappa = cpu_fft.kernel_spectrum(kernel, 64, 80)
    y = x.copy()
    cpu_fft._tile_transform(spec, 64, 80)(y)
    mu = cpu_fft.twiddle_error(64, 80)
    bound = np.linalg.norm(x) * cpu_fft.fft_error_factor(kappa, beta, 64 * 80, mu)
    assert np.abs(y[:44, :60] - exact).max() < bound / 100


def test_fft_float32_transform_and_bound():
    """numpy.fft tiles: the transform is the correlation, and its observed error on
    random data (a 1e30-scale tile too) is far below `F32Bound`, which the float32
    check uses; the bound grows with the tile's and the spectrum's norms."""
    k64 = full_rank(21, 2, np.float64)
    for scale in (100.0, 1e30):
        x = image((64, 80), np.float32, 6).astype(np.float64) / 100.0 * scale
        exact = sum(k64[i, j] * x[i : i + 44, j : j + 60] for i in range(21) for j in range(21))
        kc = np.conj(np.fft.rfft2(k64, s=(64, 80)))
        y = x.copy()
        z = np.empty((64, 41), np.complex128)
        zsq = cpu_fft._np_transform(kc, 64, 80, 44)(y, z)
        bound = cpu_fft.F32Bound(k64, 64, 80, 441, scale * 5)(float(np.square(x).sum()), zsq)
        err = np.abs(y[:44, :60] - exact).max()
        assert 0 < err < bound / 100
        assert bound < 1e-12 * scale * np.abs(k64).sum() * 64 * 80


@pytest.mark.parametrize("border", [bi.REFLECT101, bi.CONSTANT, bi.WRAP])
def test_huge_and_non_finite_float32(border):
    """1e30-scale images: separable passes within 1e-6 of the scale; an inf or NaN
    pixel sends every kernel to the direct sums, where it reaches only its own boxes."""
    kernel = gaussian(13, 2.0).astype(np.float32)
    img = image((19, 23, 3), np.float32, 60, huge=True)
    value = value_for(border, np.float32)
    assert cpu.correlate_plan(img, kernel, value)[0] == "separable"
    got = run(img, kernel, (6, 6), border, value)
    want = reference(img, kernel, (6, 6), border, value)
    assert np.abs(got - want).max() <= 1e-6 * np.abs(img).max() * np.abs(kernel).sum()
    img[9, 11, 1] = np.inf
    img[2, 3, 0] = np.nan
    assert cpu.correlate_plan(img, kernel, value)[0] == "direct64"
    got = run(img, kernel, (6, 6), border, value)
    with np.errstate(invalid="ignore"):
        want = stored(reference(img, kernel, (6, 6), border, value), np.float32)
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(got[:, :, 2]).all()  # the third channel holds neither


# ------------------------------------------------------- delegated to OpenCV


def tie_distance(acc):
    return np.abs(acc - np.floor(acc) - 0.5)


@pytest.mark.parametrize("border", list(BORDERS))
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32], ids=lambda d: d.__name__)
def test_small_kernels_through_filter2d(border, dtype):
    """Below the limit cv2.filter2D's float32 direct path (the semantics itself):
    integer kernels equal the reference; float kernels on integer images differ by at
    most 1 LSB and only within 1e-3 of a tie; float32 within 1e-6 of the scale."""
    value = value_for(border, dtype)
    rng = np.random.default_rng(7)
    for kshape, anchor in [((3, 3), (1, 1)), ((4, 7), (3, 0)), ((1, 1), (0, 0))]:
        ikernel = rng.integers(-3, 4, kshape).astype(np.float32)
        ikernel[anchor] = 4.0
        fkernel = (rng.standard_normal(kshape) / np.prod(kshape)).astype(np.float32)
        fkernel[anchor] = 1.0
        for s, shape in enumerate(SHAPES):
            img = image(shape, dtype, 70 + s)
            if np.dtype(dtype) == np.uint16:
                img >>= 4  # integer-kernel partial sums stay below 2**24 (exact in float32)
            for kernel in (ikernel, fkernel):
                assert cpu.correlate_plan(img, kernel, value)[0] == "opencv"
                got = run(img, kernel, anchor, border, value)
                acc = reference(img, kernel, anchor, border, value)
                if np.dtype(dtype) == np.float32:
                    tol = 1e-6 * np.abs(kernel).sum() * max(np.abs(img).max(), abs(value))
                    assert np.abs(got - acc).max() <= tol
                    continue
                want = stored(acc, dtype)
                if kernel is ikernel:
                    np.testing.assert_array_equal(got, want, f"{kshape} {shape}")
                else:
                    diff = np.abs(got.astype(np.int64) - want)
                    assert diff.max() <= 1
                    assert (tie_distance(acc)[diff > 0] < 1e-3).all()


# ----------------------------------------------------------------------- box


def box_sums(img, ksize, anchor, border, value):
    return reference(img, np.ones(ksize), anchor, border, value)


@pytest.mark.parametrize("border", list(BORDERS))
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16], ids=lambda d: d.__name__)
def test_integer_box(border, dtype):
    """Integer boxes (cv2.blur, or exact sums and OpenCV's fixed point for 2 pixels):
    round(sum / area), except within 1e-2 of a tie (OpenCV's scalings round there
    either way); never further than that from the mean. A 2-pixel uint8 box is
    OpenCV's (s + 2) >> 1 (cv2.blur's fixed point, which the product follows),
    saturated."""
    value = value_for(border, dtype)
    for ksize, anchor in [
        ((3, 3), (1, 1)), ((2, 1), (0, 0)), ((1, 2), (0, 1)), ((5, 8), (4, 0)), ((21, 17), (3, 9))
    ]:  # fmt: skip
        for s, shape in enumerate(SHAPES):
            img = image(shape, dtype, 90 + s)
            got = cpu.box(img, ksize, anchor, border, value, "auto")
            sums = box_sums(img, ksize, anchor, border, value)
            if ksize[0] * ksize[1] == 2 and np.dtype(dtype) == np.uint8:
                want = np.minimum((sums.astype(np.int64) + 2) >> 1, 255)
                np.testing.assert_array_equal(got, want)
                continue
            mean = sums / (ksize[0] * ksize[1])
            assert np.abs(got - mean).max() <= 0.51
            sure = tie_distance(mean) > 1e-2
            np.testing.assert_array_equal(got[sure], stored(mean, dtype)[sure], f"{ksize}")


def test_two_pixel_uint8_box_saturates():
    """OpenCV's 2-pixel uint8 box stores (255 + 255 + 2) >> 1 = 256 as 0 in its scalar
    tail; ours saturates: a 2x1 box of 255s is 255 everywhere."""
    img = np.full((5, 37, 1), 255, np.uint8)
    for ksize in ((2, 1), (1, 2)):
        got = cpu.box(img, ksize, (0, 0), bi.REFLECT101, 0.0, "auto")
        assert (got == 255).all()


@pytest.mark.parametrize("border", list(BORDERS))
def test_float32_box_direct_sums(border):
    """float32 boxes: float64 sums (within 1e-6 of the scale of the image) that never
    subtract: a 1e30 pixel, an inf and a NaN reach only the boxes that hold them,
    where cv2.blur's running sums carry them (or their rounding) further."""
    value = value_for(border, np.float32)
    for ksize, anchor in [((3, 3), (1, 1)), ((7, 4), (6, 0)), ((1, 9), (0, 4))]:
        for s, shape in enumerate(SHAPES):
            img = image(shape, np.float32, 110 + s)
            got = cpu.box(img, ksize, anchor, border, value, "auto")
            mean = box_sums(img, ksize, anchor, border, value) / (ksize[0] * ksize[1])
            assert np.abs(got - mean).max() <= 1e-6 * max(np.abs(img).max(), abs(value))
    img = image((30, 40, 1), np.float32, 120)
    img[10, 10, 0], img[20, 30, 0], img[5, 35, 0] = 1e30, np.inf, np.nan
    got = cpu.box(img, (3, 3), (1, 1), border, value, "auto")[:, :, 0]
    touched = np.zeros((30, 40), bool)
    for y, x in ((10, 10), (20, 30), (5, 35)):
        touched[y - 1 : y + 2, x - 1 : x + 2] = True
    clean = cpu.box(np.where(touched[:, :, None], 1.0, img).astype(np.float32), (3, 3), (1, 1),
                    border, value, "auto")[:, :, 0]  # fmt: skip
    far = np.ones((30, 40), bool)
    for y, x in ((10, 10), (20, 30), (5, 35)):
        far[y - 2 : y + 3, x - 2 : x + 3] = False
    assert np.isfinite(got[far]).all()
    np.testing.assert_array_equal(got[far], clean[far])
    assert np.isnan(got[4:7, 34:37]).all() and np.isinf(got[19:22, 29:32]).all()


def cv2_blur_padded(img, ksize, anchor, border, value):
    """cv2.blur of the image padded as `border` says (`np_pad`), cropped: cv2's own
    arithmetic for every border, the constant one with a value included."""
    import cv2

    (kh, kw), (ay, ax) = ksize, anchor
    h, w = img.shape[:2]
    p = np_pad(img, ay, kh - 1 - ay, ax, kw - 1 - ax, border, value)
    res = cv2.blur(p, (kw, kh), anchor=(ax, ay), borderType=cv2.BORDER_CONSTANT)
    return res.reshape(p.shape)[ay : ay + h, ax : ax + w]


@pytest.mark.parametrize("border", list(BORDERS))
def test_float32_box_blocks_and_groups(border):
    """float32 boxes over many blocks of kh rows (kh up to 70, more than a band),
    groups of column sums (kw from 8 in groups of isqrt(kw), with a remainder) and
    rows longer than one chunk of outputs: within 1e-6 of the scale of the float64
    box means and of cv2.blur; an inf reaches only the boxes that hold it."""
    value = value_for(border, np.float32)
    img = image((61, 413, 3), np.float32, 130)  # 413 * 3 values: two chunks a row
    tol = 1e-6 * max(np.abs(img).max(), abs(value))
    cases = [((23, 11), (4, 10)), ((9, 19), (8, 0)), ((5, 40), (2, 20)), ((70, 8), (35, 3))]
    for ksize, anchor in cases:
        got = cpu.box(img, ksize, anchor, border, value, "auto")
        mean = box_sums(img, ksize, anchor, border, value) / (ksize[0] * ksize[1])
        assert np.abs(got - mean).max() <= tol, ksize
        assert np.abs(got - cv2_blur_padded(img, ksize, anchor, border, value)).max() <= tol
    (kh, kw), (ay, ax) = (23, 11), (11, 5)
    spot = img.copy()
    spot[30, 200, 1] = np.inf
    got = cpu.box(spot, (kh, kw), (ay, ax), border, value, "auto")
    clean = cpu.box(img, (kh, kw), (ay, ax), border, value, "auto")
    holds = np.zeros(img.shape, bool)
    holds[30 + ay - kh + 1 : 30 + ay + 1, 200 + ax - kw + 1 : 200 + ax + 1, 1] = True
    assert np.isinf(got[holds]).all()
    np.testing.assert_array_equal(got[~holds], clean[~holds])


def contour_reference(img, border, value):
    """Gray by OpenCV's fixed-point formula, padded, the four 3x3 edge sums in int64,
    each clipped to the dtype, OR-ed."""
    from kernels.common import gray

    x = img.astype(np.int64)
    if x.shape[2] == 1:
        g = x[:, :, 0]
    else:
        g = gray.bgr_to_gray(x[:, :, 0], x[:, :, 1], x[:, :, 2])
    h, w = g.shape
    p = np_pad(g, 1, 1, 1, 1, border, value)
    hi = np.iinfo(img.dtype).max
    gx = p[:h, 2:] + p[1 : h + 1, 2:] + p[2:, 2:] - (p[:h, :w] + p[1 : h + 1, :w] + p[2:, :w])
    gy = p[2:, :w] + p[2:, 1 : w + 1] + p[2:, 2:] - (p[:h, :w] + p[:h, 1 : w + 1] + p[:h, 2:])
    parts = [np.clip(v, 0, hi) for v in (gx, -gx, gy, -gy)]
    return (parts[0] | parts[1] | parts[2] | parts[3]).astype(img.dtype)


@pytest.mark.parametrize("border", list(BORDERS))
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("numba_loaded", [True, False])
def test_contour_against_its_definition(border, dtype, numba_loaded, monkeypatch):
    """Both ways: Numba's fused pass (Numba loaded) and OpenCV's calls (not yet)."""
    monkeypatch.setattr(cpu, "_numba_loaded", lambda: numba_loaded)
    rng = np.random.default_rng(41)
    hi = np.iinfo(dtype).max
    for shape in [(37, 53, 3), (1, 29, 4), (31, 1, 1), (2, 2, 3), (64, 65, 1)]:
        img = rng.integers(0, hi + 1, shape, dtype=dtype)
        img[0, 0] = hi  # saturated responses next to the border
        value = 0 if border != bi.CONSTANT else int(rng.integers(1, hi))
        want = contour_reference(img, border, value)
        np.testing.assert_array_equal(cpu.contour(img, border, value, "auto"), want)
        out = np.empty(shape[:2], dtype)
        assert cpu.contour(img, border, value, "auto", out=out) is out
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("border", list(BORDERS))
def test_axis_maps(border):
    """cpu_common.axis_map: the source of every padded position (OpenCV's borderInterpolate,
    `_source`), pads wider than the axis and an axis of one pixel included."""
    for n, before, after in ((7, 3, 4), (1, 5, 2), (4, 9, 13), (300, 0, 127), (2, 0, 0)):
        want = [_source(p, n, border) for p in range(-before, n + after)]
        got = cpu_common.axis_map(n, before, after, border)
        assert got.dtype == np.int64 and got.tolist() == want, (n, before, after)


def _one_call_box(img, ksize, anchor, border, value, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(cpu, "BAND_BYTES", 1 << 62)
        return cpu.box(img, ksize, anchor, border, value, "auto")


@pytest.mark.parametrize("border", list(BORDERS))
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16], ids=lambda d: d.__name__)
def test_integer_box_in_row_bands_equals_one_call(border, dtype, monkeypatch):
    """cv2.blur in bands of rows on several threads gives every pixel of one call:
    every border, off-centre anchors, kernels as tall as a band allows, wide and
    tall boxes, 1 and 4 channels, saturated values."""
    calls = []
    real = cpu._in_row_bands

    def counted(*args):
        done = real(*args)
        calls.append(done)
        return done

    monkeypatch.setattr(cpu, "_in_row_bands", counted)
    monkeypatch.setattr(cpu, "BAND_BYTES", 1)
    monkeypatch.setattr(cpu, "band_threads", lambda: 3)
    value = value_for(border, dtype)
    top = np.iinfo(dtype).max
    for s, (shape, ksize, anchor) in enumerate([
        ((97, 61, 3), (21, 21), (10, 10)),
        ((131, 7, 1), (5, 1), (0, 0)),
        ((64, 33, 4), (9, 15), (8, 2)),
        ((50, 40, 3), (1, 9), (0, 4)),
        ((200, 19, 1), (31, 3), (30, 1)),
        ((33, 50, 3), (3, 3), (1, 1)),
        ((60, 9, 1), (25, 3), (24, 1)),
        ((60, 9, 3), (25, 3), (0, 1)),
    ]):  # fmt: skip
        img = image(shape, dtype, 300 + s)
        img[::7] = top  # saturated runs
        got = cpu.box(img, ksize, anchor, border, value, "auto")
        want = _one_call_box(img, ksize, anchor, border, value, monkeypatch)
        np.testing.assert_array_equal(got, want, f"{shape} {ksize} {anchor}")
    assert calls == [True, False] * 8  # in bands, then the one call to compare


def test_integer_box_bands_only_where_they_pay(monkeypatch):
    """As many bands as threads, one per BAND_BYTES of output, and one per top + bottom
    + 1 rows allow; one call where that is fewer than 2 or while another call runs in
    bands; into `out` when given."""
    img = image((600, 700, 3), np.uint8, 7)  # 1.26 MB
    bands = []  # the rows of each band filtered
    real = cpu._in_row_bands

    def counted(fn, src, crop, top, bottom, out):
        def counted_fn(part):
            bands.append(part.shape[0])
            return fn(part)

        return real(counted_fn, src, crop, top, bottom, out)

    def band_rows(*args):
        bands.clear()
        cpu.box(*args, bi.REFLECT101, 0.0, "auto")
        return sorted(bands)

    monkeypatch.setattr(cpu, "_in_row_bands", counted)
    monkeypatch.setattr(cpu, "BAND_BYTES", img.nbytes // 3)
    monkeypatch.setattr(cpu, "band_threads", lambda: 4)
    out = np.zeros_like(img)
    assert cpu.box(img, (21, 21), (10, 10), bi.REFLECT101, 0.0, "auto", out=out) is out
    assert sorted(bands) == [210, 210, 220]  # 3 bands of 200 rows, 10 or 20 rows more
    want = _one_call_box(img, (21, 21), (10, 10), bi.REFLECT101, 0.0, monkeypatch)
    np.testing.assert_array_equal(out, want)
    assert band_rows(img[:300], (21, 21), (10, 10)) == []  # under 2 x BAND_BYTES: one call
    assert band_rows(img, (301, 3), (150, 1)) == []  # bands of 301 rows: one call
    monkeypatch.setattr(cpu, "BAND_BYTES", 1)
    assert band_rows(img, (3, 3), (1, 1)) == [151, 151, 152, 152]  # one per thread
    with cpu._banding:  # another call filtering in bands: one call
        assert band_rows(img, (3, 3), (1, 1)) == []
    monkeypatch.setattr(cpu, "band_threads", lambda: 1)
    assert band_rows(img, (3, 3), (1, 1)) == []


def test_a_failing_band_raises_in_the_caller(monkeypatch):
    """An error in any band's thread reaches the caller; the other bands still end."""
    img = image((64, 10, 1), np.uint8, 3)
    monkeypatch.setattr(cpu, "band_threads", lambda: 4)
    monkeypatch.setattr(cpu, "BAND_BYTES", 1)
    seen = []

    def fn(part):
        seen.append(part.shape[0])
        if len(seen) == 2:
            raise MemoryError("band")
        return part.copy()

    with pytest.raises(MemoryError, match="band"):
        cpu._in_row_bands(fn, img[:, :, 0], None, 1, 1, np.empty_like(img))
    assert len(seen) == 4


def test_banded_boxes_from_several_threads_at_once(monkeypatch):
    """Calls from several threads at once (one in bands at a time, the others as one
    call each): every result is its one call's, bit for bit."""
    monkeypatch.setattr(cpu, "band_threads", lambda: 3)
    monkeypatch.setattr(cpu, "BAND_BYTES", 1)
    imgs = [image((90 + 7 * t, 41, 3), [np.uint8, np.uint16][t % 2], 500 + t) for t in range(6)]
    want = [_one_call_box(img, (9, 5), (4, 2), bi.REFLECT101, 0.0, monkeypatch) for img in imgs]

    def run(t):
        for _ in range(4):
            got = cpu.box(imgs[t], (9, 5), (4, 2), bi.REFLECT101, 0.0, "auto")
            np.testing.assert_array_equal(got, want[t])

    assert run_in_threads(6, run) == []
