"""Images taller than one launch grid covers (issue 27, "any image size"): filtered in
overlapping row bands on the device (`imgfilter.backends.cuda._in_row_bands`), written
straight into the result, with results equal to OpenCV's and to the unbanded call's
for every border rule, wrap included (its first and last bands gather rows from the
far end). On the simulator the band height is made tiny; on a GPU the real shapes run
(70000 rows, 600000 rows)."""

from __future__ import annotations

import numpy as np
import pytest

import imgfilter
from imgfilter.backends import cuda as backend
from imgfilter.backends import opencv as ref

BOX = np.full((5, 3), 1 / 15, np.float32)  # blur (3, 5) as a correlation kernel
BORDERS = ("reflect101", "reflect", "replicate", "constant", "wrap")
KERNEL = np.array([[1, -2, 0.5], [0, 3, 1], [2, 1, -1], [0.25, 1, 1], [1, 0, 2]], np.float32)


def _image(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == np.float32:
        return (rng.standard_normal(shape) * 100).astype(np.float32)
    return rng.integers(1, np.iinfo(dtype).max, shape).astype(dtype)


def _cases(border):
    kw = {"border": border, "border_value": 9}
    return {
        "blur": (lambda a: imgfilter.blur(a, (3, 5), anchor=(1, 3), **kw),
                 lambda a: ref.filter2d(a, BOX, anchor=(1, 3), **kw)),
        "filter2d": (lambda a: imgfilter.filter2d(a, KERNEL, **kw),
                     lambda a: ref.filter2d(a, KERNEL, **kw)),
        "filter2d naive": (lambda a: imgfilter.filter2d(a, KERNEL, method="naive", **kw),
                           lambda a: ref.filter2d(a, KERNEL, **kw)),
        "contour": (lambda a: imgfilter.contour(a, **kw), lambda a: ref.contour(a, **kw)),
    }  # fmt: skip


def _close(got, want, dtype, what):
    if dtype == np.float32:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3, err_msg=what)
    else:
        assert np.abs(got.astype(np.int64) - want).max() <= 1, what


@pytest.mark.parametrize("border", BORDERS)
@pytest.mark.parametrize("where", ["host", "device"])
def test_bands_of_rows_equal_the_whole_image(monkeypatch, border, where):
    monkeypatch.setattr(backend, "MAX_GRID_ROWS", 7)
    dtype = (np.uint8, np.uint16, np.float32)[BORDERS.index(border) % 3]
    img = _image((23, 6, 3), dtype, seed=BORDERS.index(border))
    for name, (ours, theirs) in _cases(border).items():
        if name == "contour" and dtype == np.float32:
            continue
        if where == "host":
            got = ours(img)
        else:
            from numba import cuda

            got = ours(cuda.to_device(img)).copy_to_host()
        _close(got, theirs(img), dtype, f"{name}, {border}, {where}")


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("height,rows", [(23, (2, 2)), (23, (0, 4)), (40, (3, 0)), (15, (9, 9)),
                                         (8, (1, 1)), (30, (7, 7))])  # fmt: skip
def test_row_bands_cover_the_image_and_reach_past_it_only_at_its_ends(
    monkeypatch, height, rows, wrap
):
    monkeypatch.setattr(backend, "MAX_GRID_ROWS", 7)
    bands = backend._row_bands(height, rows, wrap)
    assert [y for band in bands for y in range(*band)] == list(range(height))
    assert all(0 < y1 - y0 <= 7 for y0, y1 in bands)
    above, below = rows
    inner = bands[1:-1] if wrap else bands
    if wrap and above + below < height:
        assert bands[0] == (0, max(above, 1)) and bands[-1] == (height - max(below, 1), height)
        assert all(y0 - above >= 0 and y1 + below <= height for y0, y1 in inner)


def _device_cases(border):
    kw = {"border": border, "border_value": 9}
    return {
        "blur 3x5": lambda a: imgfilter.blur(a, (3, 5), anchor=(1, 3), **kw),
        "blur anchor on top row": lambda a: imgfilter.blur(a, (3, 4), anchor=(1, 0), **kw),
        "blur taller than a band": lambda a: imgfilter.blur(a, (3, 11), **kw),
        "filter2d": lambda a: imgfilter.filter2d(a, KERNEL, **kw),
        "filter2d last row anchor": lambda a: imgfilter.filter2d(a, KERNEL, anchor=(0, 4), **kw),
        "filter2d padded": lambda a: imgfilter.filter2d(a, KERNEL, method="padded", **kw),
        "contour": lambda a: imgfilter.contour(a, **kw),
    }


@pytest.mark.parametrize("border", BORDERS)
def test_bands_equal_the_unbanded_device_call_bit_for_bit(monkeypatch, border):
    """The bands write into the result itself; the rows each band gets wrong at its
    ends are put back or written again, so nothing of them is left."""
    from numba import cuda

    dtype = (np.uint8, np.float32, np.uint16)[BORDERS.index(border) % 3]
    img = _image((22, 4, 3), dtype, seed=40 + BORDERS.index(border))
    for name, ours in _device_cases(border).items():
        if name == "contour" and dtype == np.float32:
            continue
        whole = ours(cuda.to_device(img)).copy_to_host()
        with monkeypatch.context() as m:
            m.setattr(backend, "MAX_GRID_ROWS", 6)
            banded = ours(cuda.to_device(img)).copy_to_host()
        np.testing.assert_array_equal(banded, whole, err_msg=f"{name}, {border}")


@pytest.mark.parametrize("border", ["reflect101", "wrap"])
def test_bands_need_no_scratch_the_size_of_a_band(monkeypatch, border):
    """Device memory the bands allocate besides the result: the `above` rows each band
    saves, and under wrap the two few-row end bands; never a band's worth of rows."""
    from numba import cuda

    monkeypatch.setattr(backend, "MAX_GRID_ROWS", 8)
    img = cuda.to_device(_image((40, 6, 3), np.uint8, seed=3))
    out = cuda.device_array_like(img)
    made = []
    real = backend.empty
    monkeypatch.setattr(backend, "empty", lambda shape, *a: made.append(shape) or real(shape, *a))
    imgfilter.filter2d(img, KERNEL, border=border, out=out)
    assert made and max(shape[0] for shape in made) <= 2 + 2 + 2, made
    want = ref.filter2d(img.copy_to_host(), KERNEL, border=border)
    _close(out.copy_to_host(), want, np.uint8, border)


def test_a_batch_of_tall_frames(monkeypatch):
    from numba import cuda

    monkeypatch.setattr(backend, "MAX_GRID_ROWS", 5)
    batch = _image((2, 12, 4), np.uint8, seed=7)
    got = imgfilter.blur_batch(cuda.to_device(batch), 3, border="wrap").copy_to_host()
    for i in range(2):
        np.testing.assert_array_equal(got[i], ref.blur(batch[i], 3, border="wrap"))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape,dtype",
    [((70000, 33), np.float32), ((70000, 33, 3), np.float32), ((600000, 8), np.uint8),
     ((600000, 8), np.uint16), ((3, 300000), np.uint8)],
)  # fmt: skip
def test_tall_and_wide_images_on_the_gpu(shape, dtype):
    cp = pytest.importorskip("cupy")
    img = _image(shape, dtype, seed=shape[0])
    for border in ("reflect101", "wrap"):
        for name, (ours, theirs) in _cases(border).items():
            if name == "contour" and dtype == np.float32:
                continue
            for method in ("naive", "padded", "tiled") if name == "filter2d naive" else ():
                got = imgfilter.filter2d(cp.asarray(img), KERNEL, method=method, border=border,
                                         border_value=9).copy_to_host()  # fmt: skip
                _close(got, theirs(img), dtype, f"{name} {method}, {border}")
            got = ours(cp.asarray(img)).copy_to_host()
            _close(got, theirs(img), dtype, f"{name}, {border}, {shape}")
