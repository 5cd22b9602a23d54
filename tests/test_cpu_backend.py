"""The CPU backend's paths against an independent NumPy reference (not OpenCV).

Reference: the image padded by `np.pad` (reflect101 -> "reflect", reflect ->
"symmetric", replicate -> "edge", constant -> "constant" with the value, wrap ->
"wrap"), then the float64 correlation with the kernel's non-zero taps in row-major
order from 0 (multiply, then add): the "direct result" the backend promises for
kernels from `direct_area_limit` taps, rounded half to even and saturated for integer
outputs. Each test checks which path its cases take (`cpu.correlate_plan`), so every
path is reached: cv2.filter2D / cv2.blur delegation, separable passes with the
rounding check, float32 FMAs with the rounding check, float64 direct sums, the
float32 box and the 2-pixel uint8 box.
"""

from __future__ import annotations

import numpy as np
import pytest

from imgfilter.backends import cpu
from kernels import border_index as bi

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


def run(img, kernel, anchor, border, value):
    return cpu.correlate(img, np.asarray(kernel, np.float32), anchor, border, value, "auto")


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
            assert cpu.correlate_plan(img, kernel, value)[0] == "direct32"
            got = run(img, kernel, anchor, border, value)
            want = reference(img, kernel, anchor, border, value)
            np.testing.assert_array_equal(got, stored(want, np.uint8), f"{kshape} {shape}")
    # a larger image with many exact ties
    img = image((40, 61, 3), np.uint8, 5)
    kernel = sparse_sign_kernel((13, 13), 9, 2.0**-1)
    kernel /= np.float32(8)
    assert cpu.correlate_plan(img, kernel, value)[0] == "direct32"
    want = reference(img, kernel, (6, 6), border, value)
    assert np.mean(want % 1 == 0.5) > 0.02
    np.testing.assert_array_equal(run(img, kernel, (6, 6), border, value), stored(want, np.uint8))


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
            assert cpu.correlate_plan(img, kernel, value)[0] == "direct64"
            got = run(img, kernel, anchor, border, value)
            want = reference(img, kernel, anchor, border, value)
            np.testing.assert_array_equal(got, stored(want, dtype), f"{kshape} {shape}")


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
    """float32 boxes: direct float64 sums (within 1e-6 of the scale of the image) and
    no running sums: a 1e30 pixel, an inf and a NaN reach only the boxes that hold
    them, where cv2.blur's running sums carry them (or their rounding) further."""
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
