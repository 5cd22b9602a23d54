"""Each CUDA variant against OpenCV, through the `kernels` launch functions.

On the simulator (CI) images are tiny but shaped to reach every code path: tiles
that touch the border and tiles inside it, widths that are not multiples of the
block, kernels larger than the image. Tests marked `gpu` repeat this at full size.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from imgfilter.backends import opencv as ref
from imgfilter.border import BORDERS
from kernels.box import running as kbox
from kernels.contour import launch as kcontour
from kernels.conv import dispatch as kconv
from kernels.conv import plan as kconv_plan

METHODS = ("naive", "padded", "tiled", "window", "blocked")


def _image(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.float32:
        return (rng.standard_normal(shape) * 100).astype(np.float32)
    hi = np.iinfo(dtype).max
    return rng.integers(1, hi, shape, endpoint=True).astype(dtype)


def _correlate(img, kernel, border, method, cval=0):
    kh, kw = kernel.shape
    out = kconv.correlate(
        cuda.to_device(img),
        cuda.to_device(kernel.astype(np.float32)),
        (kh // 2, kw // 2),
        BORDERS[border],
        img.dtype.type(cval),
        method,
    )
    return out.copy_to_host()


def _assert_close(got, want, kernel, img):
    if img.dtype == np.float32:
        # "1e-5 relative": relative to the largest term the sum can hold.
        scale = max(1.0, float(np.abs(kernel).sum() * np.abs(img).max()))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("border", list(BORDERS))
def test_integer_kernel_is_bit_exact_for_every_border(method, border):
    img = _image((7, 37, 3), np.uint8)
    kernel = np.array([[1, -2, 3, 0], [-1, 4, 2, -3], [2, 0, -1, 1]], dtype=np.float32)
    got = _correlate(img, kernel, border, method, cval=9)
    want = ref.filter2d(img, kernel, None, border, 9)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
def test_other_dtypes(method, dtype):
    img = _image((6, 35, 4), dtype, seed=1)
    kernel = np.random.default_rng(2).standard_normal((3, 3)).astype(np.float32)
    got = _correlate(img, kernel, "reflect101", method)
    want = ref.filter2d(img, kernel)
    if dtype == np.uint16:
        assert np.abs(got.astype(np.int64) - want).max() <= 1
    else:
        _assert_close(got, want, kernel, img)


@pytest.mark.parametrize("method", METHODS)
def test_kernel_larger_than_image_single_row_and_column(method):
    kernel = np.random.default_rng(3).integers(-2, 3, (5, 7)).astype(np.float32)
    for shape in [(1, 9, 1), (9, 1, 1), (2, 3, 1)]:
        img = _image(shape, np.uint8, seed=4)
        for border in ("reflect101", "wrap"):
            got = _correlate(img, kernel, border, method)
            want = ref.filter2d(img[:, :, 0], kernel, None, border)
            np.testing.assert_array_equal(got[:, :, 0], want)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("ksize", [(3, 5), (6, 4)])
def test_every_method_gives_the_same_bits(dtype, ksize):
    """A random float kernel: rounding to uint8 turns any difference in the order of
    the sum into a 1-LSB difference somewhere, and method auto swaps tiled for blocked
    once the blocked kernel is compiled: every method must give identical results."""
    img = _image((13, 45, 2), dtype, seed=12)
    kernel = np.random.default_rng(13).standard_normal(ksize).astype(np.float32) / 3
    first = _correlate(img, kernel, "reflect", METHODS[0])
    for method in METHODS[1:]:
        np.testing.assert_array_equal(_correlate(img, kernel, "reflect", method), first, method)


def test_blocked_interior_tiles_match_border_tiles():
    # 300 rows: the blocked kernel's 128-row tiles include one wholly inside the
    # image, which takes the path without border mapping.
    img = _image((300, 70, 1), np.uint8, seed=5)
    kernel = np.array([[0, 1, 0], [1, -4, 1], [0, 1, 0]], dtype=np.float32)
    got = _correlate(img, kernel, "reflect101", "blocked")
    np.testing.assert_array_equal(got[:, :, 0], ref.filter2d(img[:, :, 0], kernel))


@pytest.mark.parametrize("border", ["reflect101", "constant"])
def test_window_interior_tiles_match_border_tiles(border):
    # 90 x 75: the window kernel's 32 x 32 output tiles include one whose input tile
    # (with the 9x5 kernel's halo) lies inside the image: the path without border
    # mapping. The kernel is not symmetric.
    img = _image((90, 75, 1), np.uint8, seed=5)
    kernel = np.random.default_rng(6).integers(-3, 4, (9, 5)).astype(np.float32)
    got = _correlate(img, kernel, border, "window", cval=7)
    want = ref.filter2d(img[:, :, 0], kernel, None, border, 7)
    np.testing.assert_array_equal(got[:, :, 0], want)


def _box(fn, img, k, border, cval=0):
    kh, kw = k
    out = fn(cuda.to_device(img), (kh, kw), (kh // 2, kw // 2), BORDERS[border], cval)
    return out.copy_to_host()


@pytest.mark.parametrize("fn", [kbox.box_running, kbox.box_separable], ids=["running", "separable"])
@pytest.mark.parametrize("k", [(1, 1), (3, 3), (5, 4), (7, 9)])
def test_box_uint8_equals_rounded_mean(fn, k):
    img = _image((9, 41, 3), np.uint8, seed=6)
    for border in ("reflect101", "constant", "wrap"):
        got = _box(fn, img, k, border, cval=200)
        kernel = np.full(k, 1.0)
        # Exact reference: integer window sums over the padded image, rounded half even.
        padded = ref.filter2d(img.astype(np.float64), kernel, None, border, 200)
        want = np.rint(np.round(padded) / (k[0] * k[1])).astype(np.uint8)
        np.testing.assert_array_equal(got, want)
        # and cv2.blur agrees within its own 8-bit rounding (1 LSB)
        assert np.abs(got.astype(int) - ref.blur(img, (k[1], k[0]), border, 200)).max() <= 1


@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
def test_box_running_other_dtypes(dtype):
    img = _image((8, 33, 1), dtype, seed=7)
    got = _box(kbox.box_running, img, (5, 3), "replicate")
    want = ref.blur(img, (3, 5), "replicate")
    if dtype == np.uint16:
        assert np.abs(got.astype(np.int64) - want.reshape(got.shape)).max() <= 1
    else:
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("shape", [(40, 150, 1), (35, 14, 3), (1, 5, 4), (6, 1, 1)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_contour_fused_matches_four_filter2d_and_or(shape, dtype):
    img = _image(shape, dtype, seed=8)
    for border in ("reflect101", "constant", "wrap"):
        got = kcontour.contour(cuda.to_device(img), BORDERS[border], 3).copy_to_host()
        want = ref.contour(img if shape[2] > 1 else img[:, :, 0], border, 3)
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------- full size, real GPU


@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("ksize", [(3, 3), (21, 21), (4, 7), (31, 31)])
def test_full_size_filter(method, ksize):
    img = _image((2167, 2495, 3), np.uint8, seed=9)
    kernel = (np.random.default_rng(10).standard_normal(ksize) / ksize[0]).astype(np.float32)
    if method == "tiled" and not kconv_plan.tiled_fits(*ksize):
        pytest.skip("tile does not fit shared memory")
    got = _correlate(img, kernel, "reflect101", method)
    want = ref.filter2d(img, kernel)
    assert np.abs(got.astype(int) - want).max() <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("ksize", [(3, 3), (21, 17), (4, 7), (31, 31)])
def test_full_size_methods_give_the_same_bits(dtype, ksize):
    img = _image((2167, 2495, 3), dtype, seed=14)
    kernel = (np.random.default_rng(15).standard_normal(ksize) / ksize[0]).astype(np.float32)
    methods = [m for m in METHODS if m != "tiled" or kconv_plan.tiled_fits(*ksize)]
    first = _correlate(img, kernel, "reflect101", methods[0])
    for method in methods[1:]:
        np.testing.assert_array_equal(_correlate(img, kernel, "reflect101", method), first, method)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2, 3, 21, 101])
@pytest.mark.parametrize("border", list(BORDERS))
def test_full_size_box(k, border):
    img = _image((2167, 2495, 3), np.uint8, seed=11)
    got = _box(kbox.box_running, img, (k, k), border)
    assert np.abs(got.astype(int) - ref.blur(img, k, border)).max() <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("border", list(BORDERS))
def test_full_size_contour(border):
    img = _image((2167, 2495, 3), np.uint8, seed=12)
    got = kcontour.contour(cuda.to_device(img), BORDERS[border], 0).copy_to_host()
    np.testing.assert_array_equal(got, ref.contour(img, border))


# -------------------------------------------------------------- rank-1 kernels


def test_rank1_detection():
    from kernels.conv.plan import rank1_factors

    gauss = np.outer([1, 4, 6, 4, 1], [1, 2, 1]) / 48.0
    col, row = rank1_factors(gauss)
    np.testing.assert_allclose(np.outer(col, row), gauss, atol=1e-7)
    assert rank1_factors(np.eye(3)) is None
    assert rank1_factors(np.array([[1.0, 2.0], [3.0, 4.0 + 1e-3]])) is None
    zero_col, zero_row = rank1_factors(np.zeros((2, 3)))
    assert not zero_col.any() and not zero_row.any()


def test_low_rank_factors_rebuild_the_kernel_and_count_its_rank():
    from kernels.conv.plan import kernel_rank, low_rank_factors, max_separable_rank

    rng = np.random.default_rng(3)
    k3 = sum(np.outer(rng.random(6), rng.random(5)) for _ in range(3))
    terms = low_rank_factors(k3, 3)
    assert len(terms) == 3 and kernel_rank(k3) == 3
    rebuilt = sum(np.outer(c.astype(np.float64), r) for c, r in terms)
    np.testing.assert_allclose(rebuilt, k3, rtol=1e-6, atol=1e-6 * np.abs(k3).max())
    assert low_rank_factors(k3, 2) is None
    assert kernel_rank(np.zeros((3, 4))) == 0 and len(low_rank_factors(np.zeros((3, 4)), 1)) == 1
    assert kernel_rank(np.eye(4)) == 4
    assert [max_separable_rank(k, k) for k in (3, 5, 7, 21, 31)] == [1, 2, 3, 10, 15]


def _rank_kernel(k: int, rank: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return sum(np.outer(rng.random(k), rng.random(k) - 0.3) for _ in range(rank))


def test_auto_takes_separable_passes_where_measured_cheaper():
    """conv_plan.separable_pays: rank 1 above 250 taps, rank 2 above 680, never rank 3."""
    from kernels.conv.dispatch import resolve

    def auto(kernel):
        return resolve("auto", kernel)

    gauss = np.outer(np.hanning(19)[1:-1], np.hanning(19)[1:-1])  # 17x17, 289 taps
    assert auto(gauss) == "separable"
    assert auto(gauss[1:-1, 1:-1]) == "blocked"  # 15x15: a pair of passes is no faster
    assert auto(np.ones((3, 3))) == "blocked"
    assert auto(np.ones((1, 31))) == "blocked"  # 31 taps
    assert auto(_rank_kernel(27, 2)) == "separable"
    assert auto(_rank_kernel(25, 2)) == "blocked"
    assert auto(_rank_kernel(31, 3)) == "blocked"
    assert auto(np.random.default_rng(0).random((31, 31))) == "blocked"
    # Past the blocked kernel's and the passes' 31: the size-generic kernels.
    assert auto(np.ones((33, 33))) == "window"
    assert auto(np.ones((61, 61))) == "window"
    assert auto(np.ones((62, 62))) == "tiled"  # window's tile no longer fits
    assert auto(np.ones((69, 69))) == "padded"


@pytest.mark.parametrize("border", list(BORDERS))
def test_separable_sobel_is_bit_exact(border):
    import imgfilter

    img = _image((9, 40, 3), np.uint8, seed=13)
    sobel = np.outer([1, 2, 1], [-1, 0, 1]).astype(np.float32)
    got = imgfilter.filter2d(
        img, sobel, border=border, border_value=7, backend="cuda", method="separable"
    )
    np.testing.assert_array_equal(got, ref.filter2d(img, sobel, None, border, 7))


def test_separable_float_kernel_within_one_lsb_and_rejects_full_rank():
    import imgfilter

    img = _image((8, 37, 1), np.uint8, seed=14)
    gauss = np.outer([1, 4, 6, 4, 1], [1, 2, 1]) / 48.0
    got = imgfilter.filter2d(img, gauss, backend="cuda", method="separable")
    assert np.abs(got.astype(int) - ref.filter2d(img, gauss).reshape(got.shape)).max() <= 1
    with pytest.raises(imgfilter.UsageError, match="rank-1"):
        imgfilter.filter2d(img, np.eye(3), backend="cuda", method="separable")
