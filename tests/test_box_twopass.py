"""The two-pass box kernel (`kernels.box.twopass`) against an exact integral-image reference.

On the simulator the geometry is shrunk (short runs and strips, few threads) so that
small images span several row segments, column blocks and strips, with runs and
strips that do not divide the image, boxes larger than the image, one row and one
column. Tests marked `gpu` use the default geometry at full size.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda
from test_box_fused import box_sums, exact_box
from test_box_packed import _image

from imgfilter.border import BORDERS
from kernels.box import dispatch as kbox
from kernels.box import launch as klaunch
from kernels.box import plan as box_plan
from kernels.common import border_index as bi

# box_column_tiles sums whole 32-bit words modulo 2**32 on purpose; NumPy's scalars in
# the simulator wrap the same way but warn.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in scalar add")


def _twopass(img, ksize, anchor, border, cval, **geometry):
    geo = box_plan.twopass_plan(img.shape, img.dtype, ksize, **geometry)
    assert geo is not None
    out = klaunch.box_twopass(cuda.to_device(img), ksize, anchor, BORDERS[border], cval, None, geo)
    return out.copy_to_host(), geo


# (shape, ksize, geometry): several segments, column blocks and strips on small images.
CASES = [
    ((13, 17, 3), (5, 7), dict(run=4, row_threads=8, col_threads=8, strip=4)),
    ((9, 11, 1), (21, 3), dict(run=2, row_threads=4, col_threads=4, strip=3)),  # box > image
    ((10, 9, 4), (4, 30), dict(run=4, row_threads=8, col_threads=4, strip=8)),
    ((6, 13, 2), (3, 9), dict(run=2, row_threads=8, col_threads=2, strip=5)),
    ((1, 23, 3), (3, 5), dict(run=2, row_threads=16, col_threads=4, strip=2)),  # one row
    ((19, 1, 1), (7, 3), dict(run=2, row_threads=32, col_threads=4, strip=5)),  # one column
]


@pytest.mark.parametrize("groups", [0, 3], ids=["serial", "groups"])
@pytest.mark.parametrize("shape, ksize, geometry", CASES, ids=[str(c[0]) for c in CASES])
def test_every_border_is_exact(shape, ksize, geometry, groups):
    # groups 0: box_column_means, a thread per strip; 3: box_column_tiles, three
    # threads of `strip` rows each over a tile of the strip in shared memory.
    img = _image(shape, seed=sum(shape))
    anchor = (ksize[0] // 3, ksize[1] // 2)
    geometry = dict(geometry, col_groups=groups, strip=geometry["strip"] * max(groups, 1))
    for border in BORDERS:
        got, geo = _twopass(img, ksize, anchor, border, 200, **geometry)
        np.testing.assert_array_equal(got, exact_box(img, ksize, anchor, border, 200))
    assert geo["row_grid"][1] > 1 or shape[1] < 8  # segments across where the row allows


def test_inside_blocks_unrolled_rows_and_partial_strips():
    # Strips of 9 rows: the column pass takes eight rows at a time (first window and
    # slide), then the rest; blocks and strips wholly inside the image take the
    # border-free paths (31 rows: a strip inside for the 11-row boxes too, and a last
    # strip of 4 rows); rows of 150 bytes start 0 or 2 bytes into a word. Segments of
    # 16 pixels (two runs of 8 a channel: 6 threads a block; the simulator's cost
    # follows the thread count), four a row.
    img = _image((31, 50, 3), seed=7)
    geo = dict(run=8, row_threads=6, col_threads=8, strip=9, col_groups=0)
    for ksize, border in [((5, 5), "reflect101"), ((11, 5), "constant"), ((11, 3), "wrap")]:
        anchor = (ksize[0] // 2, ksize[1] // 2)
        got, _ = _twopass(img, ksize, anchor, border, 3, **geo)
        np.testing.assert_array_equal(got, exact_box(img, ksize, anchor, border, 3))
    # Sixteen rows at a time: a 17-row box, strips of 20 rows (the second one inside,
    # the third 8 rows); one block of 16 threads for the row's 10 words.
    tall = _image((48, 20, 1), seed=8)
    got, _ = _twopass(tall, (17, 3), (8, 1), "reflect", 0, run=4, row_threads=8, strip=20,
                      col_threads=16, col_groups=0)  # fmt: skip
    np.testing.assert_array_equal(got, exact_box(tall, (17, 3), (8, 1), "reflect", 0))


def test_column_tiles_inside_blocks_idle_threads_and_short_last_strip():
    # box_column_tiles on 12 words a row in blocks of 8 (four idle threads in the
    # second). 100 rows in strips of 36: the middle strip's tile is wholly inside (direct
    # loads, eight in flight, then four for a 21-row box), the last one has 28 rows. Then
    # strips of 36 over 80 rows in threads of 12: the last strip has 8 rows, so two of
    # its threads have none. The row pass runs two threads of 12-pixel runs a row (one
    # block a row: the simulator's cost follows its thread count).
    img = _image((100, 24, 1), seed=10)
    for height, groups, kh in [(100, 2, 17), (100, 2, 21), (80, 3, 17)]:
        part = np.ascontiguousarray(img[:height])
        geo = dict(run=12, row_threads=2, col_threads=8, col_groups=groups, strip=36)
        for border in ("reflect101", "constant"):
            got, plan = _twopass(part, (kh, 3), (8, 1), border, 5, **geo)
            np.testing.assert_array_equal(got, exact_box(part, (kh, 3), (8, 1), border, 5))
        assert plan["col_smem"] == 4 * (36 + kh - 1) * 8


def test_column_tiles_fall_back_for_tall_boxes():
    # A 700-row box's tile (827 x 32 words) would not fit 96 KiB: the serial pass runs.
    img = _image((30, 8, 1), seed=13)
    geo = box_plan.twopass_plan(img.shape, img.dtype, (700, 3), col_groups=8, strip=128)
    assert geo["col_groups"] == 0 and geo["col_smem"] == 0
    got, _ = _twopass(img, (700, 3), (350, 1), "reflect", 0, col_groups=8, strip=128)
    np.testing.assert_array_equal(got, exact_box(img, (700, 3), (350, 1), "reflect", 0))


def test_off_centre_anchor_extreme_values_and_ties():
    # All-255 rows and columns next to random ones: sums at their largest; the even
    # area (24) makes exact halves, which must round to even.
    img = _image((12, 30, 3), seed=1)
    img[::2] = 255
    img[:, ::5] = 255
    for anchor in [(0, 0), (3, 5)]:
        got, _ = _twopass(img, (4, 6), anchor, "reflect", 0, run=4, row_threads=16, strip=6,
                          col_groups=2)  # fmt: skip
        np.testing.assert_array_equal(got, exact_box(img, (4, 6), anchor, "reflect", 0))
        assert (box_sums(img, (4, 6), anchor, "reflect", 0) % 24 == 12).any()  # ties to round


def test_widest_box_and_all_255():
    # 257 columns of 255 is the largest row sum that fits 16 bits.
    img = np.full((5, 40, 1), 255, np.uint8)
    img[2, 7] = 1
    got, _ = _twopass(img, (3, 257), (1, 128), "wrap", 0, run=4, row_threads=8, strip=4,
                      col_groups=2)  # fmt: skip
    np.testing.assert_array_equal(got, exact_box(img, (3, 257), (1, 128), "wrap", 0))


def test_wide_rows_load_four_words_per_thread_and_widest_rgb_box():
    # Few threads and long runs over 200- and 201-pixel rows: each thread loads its
    # words four at a time (the GPU's hot path), rows start 0, 1, 2 or 3 bytes into a
    # word (the bytes before the first whole word and after the last go in one by one),
    # and a 255-column RGB box reaches past both ends of the row.
    geo = dict(run=64, row_threads=8, col_threads=16, strip=4, col_groups=0)
    for width in (200, 201):
        img = _image((6, width, 3), seed=12)
        for ksize, anchor in [((3, 9), (1, 4)), ((5, 255), (4, 0))]:
            got, plan = _twopass(img, ksize, anchor, "reflect101", 0, **geo)
            np.testing.assert_array_equal(got, exact_box(img, ksize, anchor, "reflect101", 0))
            assert plan["row_grid"][1] == 2


def test_plan_declines_what_it_cannot_do_exactly():
    # The rounding constant of a (23136 x 257) box needs 33 bits; 65536 row segments
    # do not fit grid y; column blocks hold at most 1024 threads, an even number of
    # words wide (the tile loads pairs of words).
    assert box_plan.twopass_plan((30000, 300, 1), np.uint8, (23136, 257)) is None
    assert box_plan.twopass_plan((30000, 300, 1), np.uint8, (4095, 257)) is not None
    assert box_plan.twopass_plan((1, 2**31 - 1, 1), np.uint8, (3, 61)) is None
    assert box_plan.twopass_plan((10, 10, 3), np.uint8, (51, 3), col_groups=64) is None
    assert box_plan.twopass_plan((10, 10, 3), np.uint8, (51, 3), col_groups=3, strip=8) is None
    assert box_plan.twopass_plan((10, 10, 3), np.uint8, (5, 3), col_groups=2, col_threads=3) is None
    assert box_plan.twopass_plan((10, 10, 3), np.uint16, (51, 51)) is None
    assert box_plan.twopass_plan((10, 10, 3), np.float32, (51, 51)) is None
    assert box_plan.twopass_plan((10, 10, 1), np.uint8, (3, 258)) is None  # row sums > 16 bits
    assert box_plan.twopass_plan((10, 10, 1), np.uint8, (3, 4), run=5) is None  # odd run
    geo = box_plan.twopass_plan((2167, 2495, 3), np.uint8, (101, 101))
    assert geo["row_grid"] == (2167, 1) and geo["seg_w"] >= 2495
    assert geo["seg_w"] == geo["row_threads"] // 3 * geo["run"] and geo["pitch16"] == 7488
    with pytest.raises(ValueError, match="box_twopass handles"):
        klaunch.box_twopass(cuda.to_device(np.ones((4, 4, 1), np.uint16)), (3, 3), (1, 1), 0, 0)


def test_box_auto_takes_it_for_large_uint8_boxes():
    assert kbox.box_method((2167, 2495, 3), np.uint8, (101, 101)) == "twopass"
    assert kbox.box_method((2167, 2495, 3), np.uint16, (51, 51)) == "fused"
    img = _image((12, 10, 3), seed=9)
    got = kbox.box_auto(cuda.to_device(img), (45, 3), (22, 1), bi.REFLECT101, 0)
    np.testing.assert_array_equal(got.copy_to_host(), exact_box(img, (45, 3), (22, 1),
                                                                "reflect101", 0))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("k", [42, 61, 101, 151])
@pytest.mark.parametrize("border", list(BORDERS))
def test_full_size_default_geometry(k, border):
    img = _image((2167, 2495, 3), seed=4)
    anchor = (k // 2, k // 3)
    got, _ = _twopass(img, (k, k), anchor, border, 7)
    np.testing.assert_array_equal(got, exact_box(img, (k, k), anchor, border, 7))


@pytest.mark.gpu
@pytest.mark.parametrize("groups", [0, 4, 16])
def test_full_size_column_pass_variants(groups):
    img = _image((2167, 2495, 3), seed=11)
    got, _ = _twopass(img, (101, 101), (50, 50), "reflect101", 0, col_groups=groups)
    np.testing.assert_array_equal(got, exact_box(img, (101, 101), (50, 50), "reflect101", 0))


@pytest.mark.gpu
def test_later_calls_of_the_same_geometry_agree():
    # Other images, borders and outputs of the same geometry, one after the other.
    shape, ksize, anchor = (517, 1003, 3), (61, 45), (30, 22)
    for seed, border, cval in [(1, "reflect101", 0), (2, "constant", 9), (3, "wrap", 0)]:
        img = _image(shape, seed=seed)
        out = cuda.device_array(shape, np.uint8)
        klaunch.box_twopass(cuda.to_device(img), ksize, anchor, BORDERS[border], cval, out)
        np.testing.assert_array_equal(out.copy_to_host(),
                                      exact_box(img, ksize, anchor, border, cval))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4320, 7680, 3), (2160, 3840, 1), (777, 1001, 4)])
@pytest.mark.parametrize("ksize", [(101, 101), (257, 5), (3, 257)])
def test_other_sizes_and_shapes(shape, ksize):
    img = _image(shape, seed=5)
    anchor = (ksize[0] // 2, ksize[1] // 2)
    got = kbox.box_auto(cuda.to_device(img), ksize, anchor, 0, 0).copy_to_host()
    np.testing.assert_array_equal(got, exact_box(img, ksize, anchor, "reflect101", 0))
