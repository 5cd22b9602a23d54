"""The shared-memory tile box kernel (`kernels.box.tiled`) against an exact reference.

On the simulator a shrunk geometry (few threads, small tiles, short runs) makes small
images span several tiles across and down: border tiles, interior tiles (rows
aligned and not), partial tiles, runs and row groups, boxes larger than the image,
one row, one column, the image's last bytes outside any whole word. Tests marked
`gpu` use the default geometry at full size.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from test_box_fused import exact_box
from test_box_packed import (
    OTHER_SIZES,
    _image,
    check_every_border,
    check_full_size,
    check_interior,
    check_other_sizes,
    check_ties_round_to_even,
)

from imgfilter.border import BORDERS
from kernels.box import dispatch as kbox
from kernels.box import launch as klaunch
from kernels.box import plan as box_plan


def _tiled(img, ksize, anchor, border, cval, **geometry):
    geo = box_plan.tiled_plan(img.shape, img.dtype, ksize, **geometry)
    assert geo is not None
    out = klaunch.box_tiled(cuda.to_device(img), ksize, anchor, BORDERS[border], cval, None, geo)
    return out.copy_to_host(), geo


# (shape, ksize, anchor, geometry)
CASES = [
    ((13, 30, 3), (5, 7), (2, 3), dict(threads=16, run=4, tile_w=9, tile_h=5, groups=2)),
    ((30, 41, 1), (3, 3), (1, 1), dict(threads=8, run=4, tile_w=12, tile_h=7, groups=3)),
    ((9, 26, 4), (4, 6), (1, 2), dict(threads=16, run=3, tile_w=8, tile_h=4, groups=1)),
    ((7, 5, 3), (11, 9), (5, 4), dict(threads=32, run=2, tile_w=5, tile_h=7, groups=2)),
    ((1, 33, 3), (3, 5), (1, 2), dict(threads=16, run=4, tile_w=10, tile_h=1, groups=2)),
    ((19, 1, 1), (7, 1), (3, 0), dict(threads=4, run=1, tile_w=1, tile_h=6, groups=2)),
    # ceil(5 / 4) rows per group: the fourth group has none.
    ((11, 20, 3), (3, 5), (1, 2), dict(threads=32, run=4, tile_w=6, tile_h=5, groups=4)),
]
# Several tiles across and down: interior tiles among border tiles.
INTERIOR_CASES = [
    ((30, 100, 3), (3, 3), (1, 1), dict(threads=16, run=4, tile_w=12, tile_h=8, groups=2)),
    ((30, 101, 3), (5, 3), (2, 1), dict(threads=16, run=4, tile_w=12, tile_h=6, groups=1)),
    ((26, 90, 1), (4, 2), (3, 0), dict(threads=8, run=3, tile_w=16, tile_h=5, groups=2)),
    # The last tile's words reach the image's last whole word: n_words decides.
    ((13, 31, 1), (3, 3), (2, 2), dict(threads=16, run=4, tile_w=9, tile_h=5, groups=2)),
    # Anchor at the box's far corner: interior tiles whose words end at the row's end.
    ((20, 48, 1), (3, 3), (2, 2), dict(threads=16, run=4, tile_w=8, tile_h=5, groups=2)),
]


@pytest.mark.parametrize("shape, ksize, anchor, geometry", CASES, ids=[str(c[0]) for c in CASES])
def test_every_border_is_exact(shape, ksize, anchor, geometry):
    check_every_border(_tiled, shape, ksize, anchor, geometry)


@pytest.mark.parametrize(
    "shape, ksize, anchor, geometry", INTERIOR_CASES, ids=[str(c[0]) for c in INTERIOR_CASES]
)
def test_interior_tiles_are_exact(shape, ksize, anchor, geometry):
    check_interior(_tiled, shape, ksize, anchor, geometry)


# Tiles along the top and bottom edges whose columns lie inside the image: their rows
# go through the border rule (boxes taller than the image too), their words funnel-shifted.
EDGE_ROW_CASES = [
    ((6, 40, 3), (9, 3), (4, 1), dict(threads=16, run=4, tile_w=12, tile_h=3, groups=2)),
    ((11, 48, 1), (5, 5), (4, 0), dict(threads=8, run=4, tile_w=16, tile_h=4, groups=1)),
    ((3, 30, 4), (7, 3), (3, 1), dict(threads=32, run=3, tile_w=9, tile_h=2, groups=2)),
]


@pytest.mark.parametrize(
    "shape, ksize, anchor, geometry", EDGE_ROW_CASES, ids=[str(c[0]) for c in EDGE_ROW_CASES]
)
def test_edge_rows_of_inner_columns_every_border(shape, ksize, anchor, geometry):
    geo = box_plan.tiled_plan(shape, np.uint8, ksize, **geometry)
    assert geo["grid"][0] >= 3  # tiles away from the left and right edges
    check_every_border(_tiled, shape, ksize, anchor, geometry)


def test_extreme_values_and_ties_round_to_even():
    check_ties_round_to_even(_tiled, dict(threads=32, run=4, tile_w=10, tile_h=5))


def test_box_auto_sends_views_off_a_word_boundary_to_box_fused(monkeypatch):
    img = _image((9, 21, 3), seed=4)  # rows of 63 bytes: d[1:] starts 63 bytes in
    d_img = cuda.to_device(img)[1:]
    assert kbox.box_choice(d_img, (3, 3))[0] == "fused"
    assert kbox.box_choice(cuda.to_device(img), (3, 3))[0] == "tiled"
    called, original = [], klaunch.box_tiled
    monkeypatch.setitem(kbox._RUNNERS, "tiled", lambda *a, **k: called.append(a))
    got = kbox.box_auto(d_img, (3, 3), (1, 1), BORDERS["reflect101"], 0).copy_to_host()
    assert not called
    np.testing.assert_array_equal(got, exact_box(img[1:], (3, 3), (1, 1), "reflect101", 0))
    with pytest.raises(ValueError, match="4-byte boundary"):
        original(d_img, (3, 3), (1, 1), 0, 0)


def test_box_auto_writes_outputs_off_a_word_boundary_exactly():
    img = _image((8, 21, 3), seed=5)
    d_img = cuda.to_device(img)
    d_out = cuda.device_array((9, 21, 3), np.uint8)[1:]  # starts 63 bytes in
    assert kbox.box_choice(d_img, (3, 3), d_out)[0] == "fused"  # box_tiled writes words
    got = kbox.box_auto(d_img, (3, 3), (1, 1), BORDERS["reflect101"], 0, d_out).copy_to_host()
    np.testing.assert_array_equal(got, exact_box(img, (3, 3), (1, 1), "reflect101", 0))
    with pytest.raises(ValueError, match="out must start on a 4-byte boundary"):
        klaunch.box_tiled(d_img, (3, 3), (1, 1), 0, 0, d_out)


def test_widest_box_keeps_sixteen_bit_sums_exact():
    img = np.full((6, 262, 1), 255, np.uint8)
    img[:, ::7] = _image((6, 1, 1), seed=3)
    geometry = dict(threads=256, run=64, tile_w=262, tile_h=6)
    got, _ = _tiled(img, (3, 257), (1, 128), "replicate", 0, **geometry)
    np.testing.assert_array_equal(got, exact_box(img, (3, 257), (1, 128), "replicate", 0))


def test_plan_declines_what_it_cannot_do():
    assert box_plan.tiled_plan((10, 10, 3), np.uint16, (3, 3)) is None
    assert box_plan.tiled_plan((10, 300, 1), np.uint8, (3, 258)) is None  # 16-bit row sums
    too_small = box_plan.tiled_plan((2167, 2495, 3), np.uint8, (101, 101), smem_limit=48 * 1024)
    assert too_small is None  # a 48 KiB tile would be shorter than TILED_MIN_H rows
    assert box_plan.tiled_plan((4_200_000, 1, 1), np.uint8, (3, 3)) is None  # grid y > 65535
    seed = (2167, 2495, 3)
    geo = box_plan.tiled_plan(seed, np.uint8, (31, 31))
    assert box_plan.SMEM_LIMIT < geo["smem"] <= box_plan.TILED_SMEM_LIMIT  # opts in
    assert (geo["tile_w"] + 30) * 3 <= 4 * geo["threads"]
    small = box_plan.tiled_plan(seed, np.uint8, (61, 61), smem_limit=48 * 1024)
    assert small["smem"] <= 48 * 1024 and small["tile_h"] < box_plan.TILED_WIDE_DEFAULTS["tile_h"]
    assert box_plan.tiled_plan((10, 4, 1), np.uint8, (258, 3)) is None  # 16-bit column sums
    with pytest.raises(ValueError, match="box_tiled handles"):
        klaunch.box_tiled(cuda.to_device(np.ones((4, 4, 1), np.uint16)), (3, 3), (1, 1), 0, 0)


def test_default_geometry_follows_the_box_height():
    seed = (2167, 2495, 3)
    geos = {k: box_plan.tiled_plan(seed, np.uint8, (k, k)) for k in (3, 21, 31)}
    assert {key: geos[21][key] for key in box_plan.TILED_DEFAULTS} == box_plan.TILED_DEFAULTS
    wide = box_plan.TILED_WIDE_DEFAULTS
    assert {key: geos[31][key] for key in wide} == wide


def test_box_auto_runs_box_tiled_for_small_uint8_boxes(monkeypatch):
    ran = []
    real = klaunch.box_tiled
    monkeypatch.setitem(kbox._RUNNERS, "tiled", lambda *a: ran.append(a[-2]) or real(*a))
    img = _image((70, 70, 3), seed=11)  # default geometry: 2 x 3 tiles
    for ksize, anchor, border in [((5, 5), (2, 2), "reflect101"), ((3, 7), (0, 6), "constant")]:
        d_img = cuda.to_device(img)
        got = kbox.box_auto(d_img, ksize, anchor, BORDERS[border], 9).copy_to_host()
        np.testing.assert_array_equal(got, exact_box(img, ksize, anchor, border, 9))
    assert [geo["grid"] for geo in ran] == [(2, 3)] * 2


@pytest.mark.gpu
@pytest.mark.parametrize("k", [2, 3, 21, 31, 41])
@pytest.mark.parametrize("border", list(BORDERS))
def test_full_size_default_geometry(k, border):
    check_full_size(_tiled, k, border)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", OTHER_SIZES)
def test_other_sizes(shape):
    check_other_sizes(_tiled, shape)


@pytest.mark.gpu
def test_repeat_calls_agree():
    img = _image((300, 301, 3), seed=9)
    d_img = cuda.to_device(img)
    first = klaunch.box_tiled(d_img, (7, 7), (3, 3), 0, 0).copy_to_host()
    np.testing.assert_array_equal(first, exact_box(img, (7, 7), (3, 3), "reflect101", 0))
    out = cuda.device_array_like(d_img)
    again = klaunch.box_tiled(d_img, (7, 7), (3, 3), BORDERS["constant"], 9, out)
    assert again is out
    np.testing.assert_array_equal(out.copy_to_host(), exact_box(img, (7, 7), (3, 3), "constant", 9))
    with pytest.raises(ValueError, match="4-byte boundary"):
        view = cuda.to_device(_image((301, 301, 3), seed=4))[1:]  # same shape, 903 bytes in
        klaunch.box_tiled(view, (7, 7), (3, 3), 0, 0)


def test_an_output_of_another_shape_is_refused():
    img = _image((9, 21, 3), seed=4)
    with pytest.raises(ValueError, match="out has shape"):
        klaunch.box_tiled(
            cuda.to_device(img), (3, 3), (1, 1), 0, 0, cuda.device_array((9, 20, 3), np.uint8)
        )
