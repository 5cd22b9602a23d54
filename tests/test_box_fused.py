"""The one-pass box kernel (`kernels.box.fused`, launched by `kernels.box.launch.box_fused`)
against an exact integral-image reference.

On the simulator the geometry is shrunk (few threads, short runs, strips and batches)
so that small images still span several blocks across and down, with strips, batches
and runs that do not divide the image, boxes wider than a tile's outputs and larger
than the image. Tests marked `gpu` use the default geometry at full size.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from imgfilter.backends import opencv as ref
from imgfilter.border import BORDERS, pad
from kernels.box import dispatch as kbox
from kernels.box import launch as klaunch
from kernels.box import plan as box_plan
from kernels.common import border_index as bi


def box_sums(img: np.ndarray, ksize, anchor, border: str, cval: int) -> np.ndarray:
    """int64 box sums of the padded image, from its integral image."""
    kh, kw = ksize
    ay, ax = anchor
    padded = pad(img, ay, kh - 1 - ay, ax, kw - 1 - ax, border, cval).astype(np.int64)
    integral = np.zeros((padded.shape[0] + 1, padded.shape[1] + 1, img.shape[2]), np.int64)
    integral[1:, 1:] = padded.cumsum(0).cumsum(1)
    h, w = img.shape[:2]
    sums = integral[kh : kh + h, kw : kw + w] - integral[:h, kw : kw + w]
    return sums - integral[kh : kh + h, :w] + integral[:h, :w]


def exact_box(img: np.ndarray, ksize, anchor, border: str, cval: int) -> np.ndarray:
    """round(box sum / area) half to even."""
    sums = box_sums(img, ksize, anchor, border, cval)
    return np.rint(sums / (ksize[0] * ksize[1])).astype(img.dtype)  # float64 keeps halves exact


def _image(shape, dtype, seed):
    hi = np.iinfo(dtype).max
    return np.random.default_rng(seed).integers(1, hi, shape, endpoint=True).astype(dtype)


def _fused(img, ksize, anchor, border, cval, **geometry):
    geo = box_plan.plan(img.shape, img.dtype, ksize, **geometry)
    assert geo is not None
    d_img = cuda.to_device(img)
    out = klaunch.box_fused(d_img, ksize, anchor, BORDERS[border], cval, geometry=geo)
    return out.copy_to_host(), geo


def test_reference_agrees_with_opencv_blur():
    img = _image((13, 17, 3), np.uint8, seed=0)
    for border in BORDERS:
        want = exact_box(img, (5, 3), (2, 1), border, 0)
        assert np.abs(want.astype(int) - ref.blur(img, (3, 5), border)).max() <= 1


# (shape, ksize, geometry): several blocks across and down on small images.
CASES = [
    ((13, 30, 3), (5, 7), dict(threads=16, run=4, strip=6, batch=4)),
    ((30, 41, 1), (3, 3), dict(threads=8, run=4, strip=16, batch=5)),
    ((9, 26, 4), (4, 6), dict(threads=16, run=3, strip=4, batch=4)),
    ((7, 5, 3), (11, 9), dict(threads=32, run=2, strip=3, batch=2)),  # box > image
    ((1, 33, 3), (3, 5), dict(threads=16, run=4, strip=2, batch=2)),  # one row
    ((19, 1, 1), (7, 1), dict(threads=8, run=1, strip=5, batch=2)),  # one column
]
# Blocks wholly inside the image (no border logic) among border blocks; one dtype
# each, to keep the simulator's time down (the inside path does not depend on it).
INSIDE_CASES = [
    ((24, 60, 1), (3, 3), dict(threads=8, run=4, strip=8, batch=3), np.uint8),
    ((30, 40, 3), (3, 5), dict(threads=16, run=4, strip=8, batch=4), np.uint16),
]


@pytest.mark.parametrize(
    "shape, ksize, geometry, dtype",
    [(*c, dt) for c in CASES for dt in (np.uint8, np.uint16)] + INSIDE_CASES,
    ids=[f"{c[0]}-{dt.__name__}" for c in CASES for dt in (np.uint8, np.uint16)]
    + [f"{c[0]}-{c[3].__name__}-inside" for c in INSIDE_CASES],
)
def test_every_border_is_exact(shape, ksize, geometry, dtype):
    img = _image(shape, dtype, seed=sum(shape))
    anchor = (ksize[0] // 2, ksize[1] // 2)
    for border in BORDERS:
        got, geo = _fused(img, ksize, anchor, border, 200, **geometry)
        np.testing.assert_array_equal(got, exact_box(img, ksize, anchor, border, 200))
    assert geo["sum_type"] == (np.uint16 if dtype == np.uint8 else np.int32)


@pytest.mark.parametrize("magic_rounding", [True, False])
def test_off_centre_anchor_extreme_values_and_ties(magic_rounding):
    # All-255 rows next to random rows: sums at their largest; the even area (24)
    # makes exact halves, which must round to even.
    img = _image((12, 30, 3), np.uint8, seed=1)
    img[::2] = 255
    geo = box_plan.plan(img.shape, img.dtype, (4, 6), threads=16, run=4, strip=5, batch=2)
    geo["magic_rounding"] = magic_rounding
    for anchor in [(0, 0), (3, 5)]:
        out = klaunch.box_fused(cuda.to_device(img), (4, 6), anchor, bi.REFLECT, 0, None, geo)
        want = exact_box(img, (4, 6), anchor, "reflect", 0)
        np.testing.assert_array_equal(out.copy_to_host(), want)
        assert (box_sums(img, (4, 6), anchor, "reflect", 0) % 24 == 12).any()  # ties to round


def test_uint16_large_box_uses_int32_sums_and_exact_rounding():
    img = _image((20, 70, 1), np.uint16, seed=2)
    img[:, ::3] = 65535
    got, geo = _fused(img, (17, 31), (8, 15), "wrap", 0, threads=16, run=4, strip=8, batch=3)
    assert geo["sum_type"] == np.int32 and not geo["magic_rounding"] and geo["grid"][0] > 1
    np.testing.assert_array_equal(got, exact_box(img, (17, 31), (8, 15), "wrap", 0))


def test_plan_declines_what_it_cannot_do_exactly():
    assert box_plan.plan((10, 10, 3), np.float32, (3, 3)) is None
    assert box_plan.plan((10, 10, 1), np.uint16, (201, 201)) is None  # sums past int32
    assert box_plan.plan((10, 10, 4), np.uint8, (3, 301)) is None  # tile cannot hold the halo
    geo = box_plan.plan((2167, 2495, 3), np.uint8, (21, 21))
    assert geo["tile_w"] % geo["run"] == 0
    assert (geo["tile_w"] + 20) * 3 <= box_plan.LANES * geo["threads"]
    with pytest.raises(ValueError, match="box_fused handles"):
        klaunch.box_fused(cuda.to_device(np.ones((4, 4, 1), np.float32)), (3, 3), (1, 1), 0, 0)


def test_box_auto_falls_back_for_float_images():
    img = np.random.default_rng(3).random((6, 9, 1)).astype(np.float32)
    got = kbox.box_auto(cuda.to_device(img), (3, 3), (1, 1), bi.REFLECT101, 0).copy_to_host()
    np.testing.assert_allclose(got[:, :, 0], ref.blur(img, 3), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2, 3, 21, 101])
@pytest.mark.parametrize("border", list(BORDERS))
def test_full_size_default_geometry(k, border):
    img = _image((2167, 2495, 3), np.uint8, seed=4)
    anchor = (k // 2, k // 2)
    got = kbox.box_auto(cuda.to_device(img), (k, k), anchor, BORDERS[border], 7).copy_to_host()
    np.testing.assert_array_equal(got, exact_box(img, (k, k), anchor, border, 7))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4320, 7680, 3), (2160, 3840, 1), (777, 1001, 4)])
def test_other_sizes_and_uint16(shape):
    for dtype, k in [(np.uint8, 21), (np.uint16, 9)]:
        img = _image(shape, dtype, seed=5)
        anchor = (k // 2, k // 2)
        got = kbox.box_auto(cuda.to_device(img), (k, k), anchor, 0, 0).copy_to_host()
        np.testing.assert_array_equal(got, exact_box(img, (k, k), anchor, "reflect101", 0))
