"""The prefetching box kernel (`kernels.box_pipelined`) against an exact reference.

The cases are box_packed's (tests/test_box_packed.py): on the simulator a shrunk
geometry makes small images span several blocks across and down (border blocks,
interior blocks with rows aligned and not, partial runs, batches and strips, boxes
wider than a tile's outputs and larger than the image, one row, one column, the
image's last bytes outside any whole word). Batches of 1 to 5 rows exercise the
prefetch of a batch that starts past the strip's end. Tests marked `gpu` use the
default geometry at full size.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from test_box_fused import box_sums, exact_box
from test_box_packed import CASES, INTERIOR_CASES, _image

from imgfilter.border import BORDERS
from kernels import box_pipelined as kpipe
from kernels import box_plan


def _pipelined(img, ksize, anchor, border, cval, **geometry):
    geo = box_plan.pipelined_plan(img.shape, img.dtype, ksize, **geometry)
    assert geo is not None
    out = kpipe.box_pipelined(cuda.to_device(img), ksize, anchor, BORDERS[border], cval, None, geo)
    return out.copy_to_host(), geo


@pytest.mark.parametrize("shape, ksize, anchor, geometry", CASES, ids=[str(c[0]) for c in CASES])
def test_every_border_is_exact(shape, ksize, anchor, geometry):
    img = _image(shape, seed=sum(shape))
    for border in BORDERS:
        got, _ = _pipelined(img, ksize, anchor, border, 200, **geometry)
        np.testing.assert_array_equal(got, exact_box(img, ksize, anchor, border, 200))


@pytest.mark.parametrize(
    "shape, ksize, anchor, geometry", INTERIOR_CASES, ids=[str(c[0]) for c in INTERIOR_CASES]
)
def test_interior_blocks_are_exact(shape, ksize, anchor, geometry):
    img = _image(shape, seed=sum(shape) + 1)
    for border in ("reflect101", "constant"):
        got, geo = _pipelined(img, ksize, anchor, border, 7, **geometry)
        assert min(geo["grid"]) >= 3  # blocks away from every edge
        np.testing.assert_array_equal(got, exact_box(img, ksize, anchor, border, 7))


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_batches_that_do_not_divide_the_strip(batch):
    img = _image((23, 60, 3), seed=batch)
    got, _ = _pipelined(img, (7, 5), (3, 2), "reflect", 0, threads=16, run=4, strip=11, batch=batch)
    np.testing.assert_array_equal(got, exact_box(img, (7, 5), (3, 2), "reflect", 0))


def test_extreme_values_and_ties_round_to_even():
    img = _image((12, 62, 3), seed=1)
    img[::2] = 255
    for anchor in [(0, 0), (3, 5)]:
        geometry = dict(threads=16, run=4, strip=5, batch=2)
        got, geo = _pipelined(img, (4, 6), anchor, "reflect", 0, **geometry)
        assert geo["even"]
        np.testing.assert_array_equal(got, exact_box(img, (4, 6), anchor, "reflect", 0))
        assert (box_sums(img, (4, 6), anchor, "reflect", 0) % 24 == 12).any()


def test_tallest_box_keeps_sixteen_bit_column_sums_exact():
    img = np.full((262, 24, 1), 255, np.uint8)
    img[::7] = _image((1, 24, 1), seed=3)
    got, _ = _pipelined(img, (257, 3), (128, 1), "replicate", 0, threads=8, run=4, strip=262)
    np.testing.assert_array_equal(got, exact_box(img, (257, 3), (128, 1), "replicate", 0))


def test_plan_declines_what_it_cannot_do():
    assert box_plan.pipelined_plan((10, 10, 3), np.uint16, (3, 3)) is None
    assert box_plan.pipelined_plan((10, 10, 3), np.uint8, (258, 3)) is None
    assert box_plan.pipelined_plan((10, 10, 4), np.uint8, (3, 1200)) is None  # no tile holds it
    geo = box_plan.pipelined_plan((2167, 2495, 3), np.uint8, (21, 21))
    assert geo["tile_w"] % geo["run"] == 0
    assert (geo["tile_w"] + 20) * 3 <= 4 * geo["threads"]
    with pytest.raises(ValueError, match="box_pipelined handles"):
        kpipe.box_pipelined(cuda.to_device(np.ones((4, 4, 1), np.uint16)), (3, 3), (1, 1), 0, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2, 3, 21, 101, 201])
@pytest.mark.parametrize("border", list(BORDERS))
def test_full_size_default_geometry(k, border):
    img = _image((2167, 2495, 3), seed=6)
    anchor = (k // 2, k // 2)
    got, _ = _pipelined(img, (k, k), anchor, border, 7)
    np.testing.assert_array_equal(got, exact_box(img, (k, k), anchor, border, 7))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4320, 7680, 3), (2160, 3840, 1), (777, 1001, 4), (5, 3, 3)])
def test_other_sizes(shape):
    for k in (1, 9, 31):
        img = _image(shape, seed=7)
        anchor = (k // 2, k // 3)
        got, _ = _pipelined(img, (k, k), anchor, "reflect101", 0)
        np.testing.assert_array_equal(got, exact_box(img, (k, k), anchor, "reflect101", 0))
