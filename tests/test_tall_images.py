"""Images taller than one launch grid covers (issue 27, "any image size"): filtered in
overlapping row bands on the device (`imgfilter.backends.cuda._in_row_bands`), with
results equal to OpenCV's for every border rule, wrap included (its first and last
bands gather rows from the far end). On the simulator the band height is made tiny;
on a GPU the real shapes run (70000 rows, 600000 rows)."""

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
