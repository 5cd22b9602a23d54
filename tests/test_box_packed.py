"""The packed box kernel (`kernels.box.packed`) against an exact integral-image reference.

On the simulator the geometry is shrunk (few threads, short runs, strips and batches)
so that small images span several blocks across and down: border blocks, interior
blocks (whole-word reads, rows aligned and not), partial runs and batches, boxes
wider than a tile's outputs and larger than the image, one row, one column, the
image's last bytes outside any whole word. Tests marked `gpu` use the default
geometry at full size.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from test_box_fused import box_sums, exact_box

from imgfilter.border import BORDERS
from kernels.box import dispatch as kbox
from kernels.box import launch as klaunch
from kernels.box import plan as box_plan


def _image(shape, seed):
    return np.random.default_rng(seed).integers(1, 255, shape, endpoint=True).astype(np.uint8)


def _packed(img, ksize, anchor, border, cval, **geometry):
    geo = box_plan.packed_plan(img.shape, img.dtype, ksize, **geometry)
    assert geo is not None
    out = klaunch.box_packed(cuda.to_device(img), ksize, anchor, BORDERS[border], cval, None, geo)
    return out.copy_to_host(), geo


# (shape, ksize, anchor, geometry)
CASES = [
    ((13, 30, 3), (5, 7), (2, 3), dict(threads=8, run=4, strip=6, batch=4)),
    ((30, 41, 1), (3, 3), (1, 1), dict(threads=4, run=4, strip=16, batch=5)),  # 41 % 4 != 0
    ((9, 26, 4), (4, 6), (1, 2), dict(threads=8, run=3, strip=4, batch=4)),  # even area
    ((7, 5, 3), (11, 9), (5, 4), dict(threads=16, run=2, strip=3, batch=2)),  # box > image
    ((1, 33, 3), (3, 5), (1, 2), dict(threads=8, run=4, strip=2, batch=2)),  # one row
    ((19, 1, 1), (7, 1), (3, 0), dict(threads=4, run=1, strip=5, batch=2)),  # one column
]
# Several tiles across and strips down: interior blocks among border blocks.
INTERIOR_CASES = [
    ((30, 100, 3), (3, 3), (1, 1), dict(threads=8, run=4, strip=8, batch=3)),  # rows aligned
    ((30, 101, 3), (5, 3), (2, 1), dict(threads=8, run=4, strip=8, batch=3)),  # rows not
    ((26, 90, 1), (4, 2), (3, 0), dict(threads=4, run=3, strip=7, batch=4)),
]


# Checks shared with tests/test_box_tiled.py. `run(img, ksize, anchor, border, cval,
# **geometry)` filters with a word-reading uint8 kernel and returns (image, geometry).


def check_every_border(run, shape, ksize, anchor, geometry) -> None:
    img = _image(shape, seed=sum(shape))
    for border in BORDERS:
        got, _ = run(img, ksize, anchor, border, 200, **geometry)
        np.testing.assert_array_equal(got, exact_box(img, ksize, anchor, border, 200))


def check_interior(run, shape, ksize, anchor, geometry) -> None:
    img = _image(shape, seed=sum(shape) + 1)
    for border in ("reflect101", "constant"):
        got, geo = run(img, ksize, anchor, border, 7, **geometry)
        assert min(geo["grid"]) >= 3  # blocks away from every edge
        np.testing.assert_array_equal(got, exact_box(img, ksize, anchor, border, 7))


def check_ties_round_to_even(run, geometry) -> None:
    # All-255 rows next to random rows: sums at their largest; the even area (24)
    # makes exact halves, which must round to even.
    img = _image((12, 62, 3), seed=1)
    img[::2] = 255
    for anchor in [(0, 0), (3, 5)]:
        got, geo = run(img, (4, 6), anchor, "reflect", 0, **geometry)
        assert geo["even"]
        np.testing.assert_array_equal(got, exact_box(img, (4, 6), anchor, "reflect", 0))
        assert (box_sums(img, (4, 6), anchor, "reflect", 0) % 24 == 12).any()


@pytest.mark.parametrize("shape, ksize, anchor, geometry", CASES, ids=[str(c[0]) for c in CASES])
def test_every_border_is_exact(shape, ksize, anchor, geometry):
    check_every_border(_packed, shape, ksize, anchor, geometry)


@pytest.mark.parametrize(
    "shape, ksize, anchor, geometry", INTERIOR_CASES, ids=[str(c[0]) for c in INTERIOR_CASES]
)
def test_interior_blocks_are_exact(shape, ksize, anchor, geometry):
    check_interior(_packed, shape, ksize, anchor, geometry)


def test_extreme_values_and_ties_round_to_even():
    check_ties_round_to_even(_packed, dict(threads=8, run=4, strip=5, batch=2))


def test_tallest_box_keeps_sixteen_bit_column_sums_exact():
    img = np.full((262, 24, 1), 255, np.uint8)  # one strip: the simulator's cost is per row
    img[::7] = _image((1, 24, 1), seed=3)
    got, _ = _packed(img, (257, 3), (128, 1), "replicate", 0, threads=8, run=4, strip=262)
    np.testing.assert_array_equal(got, exact_box(img, (257, 3), (128, 1), "replicate", 0))


def test_plan_declines_what_it_cannot_do():
    assert box_plan.packed_plan((10, 10, 3), np.uint16, (3, 3)) is None
    assert box_plan.packed_plan((10, 10, 3), np.uint8, (258, 3)) is None  # 16-bit column sums
    assert box_plan.packed_plan((10, 10, 4), np.uint8, (3, 1200)) is None  # no tile holds it
    geo = box_plan.packed_plan((2167, 2495, 3), np.uint8, (21, 21))
    assert geo["tile_w"] % geo["run"] == 0
    assert (geo["tile_w"] + 21) * 3 <= 8 * geo["threads"]  # halo plus one pixel of slack
    with pytest.raises(ValueError, match="box_packed handles"):
        klaunch.box_packed(cuda.to_device(np.ones((4, 4, 1), np.uint16)), (3, 3), (1, 1), 0, 0)


def test_magic_division_is_exact_for_every_area_up_to_257_squared():
    t = np.concatenate([np.arange(0, 5000), np.random.default_rng(4).integers(0, 2**26, 5000)])
    t = t.astype(np.uint64)
    for area in [1, 2, 3, 9, 24, 32, 33, 441, 10201, 257 * 257]:
        m, sh = box_plan.packed_magic(area)
        assert m < 2**32
        np.testing.assert_array_equal(((t * np.uint64(m)) >> np.uint64(32 + sh)), t // (2 * area))


def test_box_auto_choice():
    img = _image((9, 14, 3), seed=5)
    got = kbox.box_auto(cuda.to_device(img), (3, 5), (1, 2), 0, 0).copy_to_host()
    np.testing.assert_array_equal(got, exact_box(img, (3, 5), (1, 2), "reflect101", 0))
    assert kbox.box_method(img.shape, img.dtype, (3, 5)) == "tiled"  # fastest up to TILED_MAX_BOX
    big = box_plan.TILED_MAX_BOX + 1
    assert box_plan.tiled_plan(img.shape, img.dtype, (3, big)) is not None
    assert kbox.box_method(img.shape, img.dtype, (3, big)) == "twopass"  # larger boxes
    assert kbox.box_method(img.shape, img.dtype, (big, 3)) == "twopass"
    assert kbox.box_method(img.shape, np.uint16, (3, 5)) == "fused"
    assert kbox.box_method(img.shape, np.float32, (3, 5)) == "running"
    got = kbox.box_auto(cuda.to_device(img), (3, big), (1, 2), 0, 0).copy_to_host()
    np.testing.assert_array_equal(got, exact_box(img, (3, big), (1, 2), "reflect101", 0))


def check_full_size(run, k: int, border: str) -> None:
    """The default geometry on a seed-size RGB image (GPU tests)."""
    img = _image((2167, 2495, 3), seed=6)
    anchor = (k // 2, k // 2)
    got, _ = run(img, (k, k), anchor, border, 7)
    np.testing.assert_array_equal(got, exact_box(img, (k, k), anchor, border, 7))


def check_other_sizes(run, shape) -> None:
    """The default geometry on other sizes and channel counts (GPU tests)."""
    for k in (1, 9, 31):
        img = _image(shape, seed=7)
        anchor = (k // 2, k // 3)
        got, _ = run(img, (k, k), anchor, "reflect101", 0)
        np.testing.assert_array_equal(got, exact_box(img, (k, k), anchor, "reflect101", 0))


OTHER_SIZES = [(4320, 7680, 3), (2160, 3840, 1), (777, 1001, 4), (5, 3, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2, 3, 21, 101, 201])
@pytest.mark.parametrize("border", list(BORDERS))
def test_full_size_default_geometry(k, border):
    check_full_size(_packed, k, border)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", OTHER_SIZES)
def test_other_sizes(shape):
    check_other_sizes(_packed, shape)
