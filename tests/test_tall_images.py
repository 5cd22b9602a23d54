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
def test_bands_of_rows_equal_the_whole_image(monkeypatch, border):
    """Host images (device images: test_bands_equal_the_unbanded_device_call_bit_for_bit,
    which also checks these calls against OpenCV)."""
    monkeypatch.setattr(backend, "MAX_GRID_ROWS", 7)
    dtype = (np.uint8, np.uint16, np.float32)[BORDERS.index(border) % 3]
    img = _image((23, 6, 3), dtype, seed=BORDERS.index(border))
    for name, (ours, theirs) in _cases(border).items():
        if name == "contour" and dtype == np.float32:
            continue
        _close(ours(img), theirs(img), dtype, f"{name}, {border}")


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("height,rows", [(23, (2, 2)), (23, (0, 4)), (40, (3, 0)), (15, (9, 9)),
                                         (8, (1, 1)), (30, (7, 7))])  # fmt: skip
def test_row_bands_cover_the_image_and_reach_past_it_only_at_its_ends(height, rows, wrap):
    bands = backend._row_bands(height, rows, wrap, 7)
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
        "blur": lambda a: imgfilter.blur(a, (3, 5), anchor=(1, 3), **kw),
        "blur anchor on top row": lambda a: imgfilter.blur(a, (3, 4), anchor=(1, 0), **kw),
        "blur taller than a band": lambda a: imgfilter.blur(a, (3, 11), **kw),
        "filter2d": lambda a: imgfilter.filter2d(a, KERNEL, **kw),
        "filter2d naive": lambda a: imgfilter.filter2d(a, KERNEL, method="naive", **kw),
        "filter2d last row anchor": lambda a: imgfilter.filter2d(a, KERNEL, anchor=(0, 4), **kw),
        "filter2d padded": lambda a: imgfilter.filter2d(a, KERNEL, method="padded", **kw),
        "contour": lambda a: imgfilter.contour(a, **kw),
    }


@pytest.mark.parametrize("border", BORDERS)
def test_bands_equal_the_unbanded_device_call_bit_for_bit(monkeypatch, border):
    """The bands write into the result itself; the rows each band gets wrong at its
    ends are put back or written again, so nothing of them is left. The calls that
    `_cases` has are also checked against OpenCV. A gray image: the bands are full
    rows whatever the channels (one channel's launches cost the simulator about half
    of three channels'; the kernels' channel counts are their own tests')."""
    from numba import cuda

    dtype = (np.uint8, np.float32, np.uint16)[BORDERS.index(border) % 3]
    img = _image((22, 4), dtype, seed=40 + BORDERS.index(border))
    references = _cases(border)
    banded_calls = []
    real = backend._in_row_bands
    for name, ours in _device_cases(border).items():
        if name == "contour" and dtype == np.float32:
            continue
        whole = ours(cuda.to_device(img)).copy_to_host()
        banded_calls.clear()
        with monkeypatch.context() as m:
            m.setattr(backend, "MAX_GRID_ROWS", 8)  # 3 bands or more; an 11-row box
            m.setattr(backend, "_in_row_bands", lambda *a: banded_calls.append(1) or real(*a))
            banded = ours(cuda.to_device(img)).copy_to_host()
        assert banded_calls == [1], f"{name}, {border}: not in bands"
        np.testing.assert_array_equal(banded, whole, err_msg=f"{name}, {border}")
        if name in references:
            _close(banded, references[name][1](img), dtype, f"{name}, {border}")


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


def test_box_bands_for_images_too_large_for_the_fast_kernels():
    """uint8 images of 2**31 bytes or more get bands of fewer bytes, where the fast box
    kernels run (box_fused, which box_auto gives the whole image, is slower)."""
    from kernels.box import dispatch

    rows = (10, 10)
    for shape in [(10923, 65536, 3), (40000, 40000, 3), (2**20, 2048, 1)]:
        most = backend._box_band_rows(shape, np.dtype(np.uint8), (21, 21), rows)
        band = (most + 20, *shape[1:])
        assert most < shape[0] and np.prod(band) <= dispatch.BOX_BAND_BYTES, shape
        assert dispatch.box_method(band, np.uint8, (21, 21)) == "tiled", shape
        assert dispatch.box_method(shape, np.uint8, (21, 21)) == "fused", shape
    for shape, dtype in [((10880, 65536, 3), np.uint8), ((10923, 65536, 3), np.uint16),
                         ((64, 2**24, 3), np.uint8)]:  # fmt: skip
        # Under the limit; no fast uint16 kernel; bands of a few rows would be mostly reach.
        assert backend._box_band_rows(shape, np.dtype(dtype), (21, 21), rows) == 32768


# The four entry points into the bands that test_bands_equal_the_unbanded_device_call_
# bit_for_bit checks: --sample (CI's lowest versions) leaves them to it.
@pytest.mark.covered_elsewhere
@pytest.mark.parametrize("border, dtype", [("wrap", np.uint16), ("reflect", np.uint8)])
def test_box_bands_of_large_images_equal_one_call(monkeypatch, border, dtype):
    """Bands where `_box_band_rows` asks for them (made small here), from a device
    image, a device batch, a device list and a host image in one piece: each asks
    `_box_band_rows` and hands its images to `_in_row_bands`, whose bands
    test_bands_equal_the_unbanded_device_call_bit_for_bit checks for every border.
    Here wrap (its own end bands) on box_fused and reflect on box_tiled, on gray
    images (the same kernels as three channels', at about half the simulator's cost)."""
    from numba import cuda

    # On a GPU, box_tiled's first use would run its stand-in (box_twopass, not banded)
    # while it compiled in the background: compiled at once instead.
    monkeypatch.setattr(backend.background, "ENABLED", False)
    img = _image((19, 5), dtype, seed=60 + BORDERS.index(border))
    batch = np.stack([img, img[::-1].copy()])
    kw = {"anchor": (1, 3), "border": border, "border_value": 9}

    def calls():
        return {
            "device": imgfilter.blur(cuda.to_device(img), (3, 5), **kw).copy_to_host(),
            "batch": imgfilter.blur_batch(cuda.to_device(batch), (3, 5), **kw).copy_to_host(),
            "list": [o.copy_to_host() for o in imgfilter.blur_batch(
                [cuda.to_device(img), cuda.to_device(batch[1])], (3, 5), **kw)],
            "host": imgfilter.blur(img, (3, 5), backend="cuda", max_gpu_bytes=1 << 30, **kw),
        }  # fmt: skip

    whole = calls()
    bands = []
    real = backend._row_bands

    def spy(*args):
        bands.append(real(*args))
        return bands[-1]

    monkeypatch.setattr(backend, "_box_band_rows", lambda *a: 8)
    monkeypatch.setattr(backend, "_row_bands", spy)
    banded = calls()
    # One image, two of a batch, two of a list, one host image; bands of 8 rows, the
    # last fewer (wrap's first and last bands: the rows the box reaches).
    assert len(bands) == 6, bands
    for made in bands:
        sizes = [y1 - y0 for y0, y1 in made]
        inner = sizes[1:-1] if border == "wrap" else sizes
        assert inner[:-1] and all(n == 8 for n in inner[:-1]) and 0 < inner[-1] <= 8, made
        assert sum(sizes) == 19, made
    for name in whole:
        np.testing.assert_array_equal(banded[name], whole[name], err_msg=f"{name}, {border}")


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
            for method in (
                ("naive", "padded", "tiled", "window") if name == "filter2d naive" else ()
            ):
                got = imgfilter.filter2d(cp.asarray(img), KERNEL, method=method, border=border,
                                         border_value=9).get()  # fmt: skip
                _close(got, theirs(img), dtype, f"{name} {method}, {border}")
            got = ours(cp.asarray(img)).get()
            _close(got, theirs(img), dtype, f"{name}, {border}, {shape}")
