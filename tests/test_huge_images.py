"""Images of more than 2**31 elements (issue 27, "any image size"): element offsets
past the 32-bit range, where an int32 index would wrap. On a GPU each operation runs
on a whole device image of ~2.15e9 bytes and its first and last bands of rows, and
the rows at each seam between the row bands the device filters it in (32768 rows a
band; uint8 boxes in bands of fewer than 2**31 bytes), are compared with OpenCV on
the same rows (each with the rows of halo the kernel reads, at the image's own top or
bottom edge). Skipped without a GPU: on the simulator such an image would take
hours."""

from __future__ import annotations

import numpy as np
import pytest

import imgfilter
from imgfilter.backends import cuda as backend
from imgfilter.backends import opencv as ref
from kernels.box.dispatch import box_method

BAND = 48  # rows compared at each end
KERNEL = np.array([[1, -2, 0.5], [0, 3, 1], [2, 1, -1]], np.float32)
SHAPES = {1: (46400, 46400), 3: (26800, 26800, 3)}  # 2.153e9 and 2.155e9 elements


def _huge(shape) -> np.ndarray:
    rng = np.random.default_rng(sum(shape))
    return np.frombuffer(rng.bytes(int(np.prod(shape))), np.uint8).reshape(shape)


def _ends_match(got: np.ndarray, img: np.ndarray, reference, halo: int, what: str) -> None:
    """got's first and last BAND rows equal reference() of those rows plus halo."""
    top = reference(img[: BAND + halo])[:BAND]
    np.testing.assert_array_equal(got[:BAND], top, err_msg=f"{what}: first rows")
    bottom = reference(img[-(BAND + halo) :])[halo:]
    np.testing.assert_array_equal(got[-BAND:], bottom, err_msg=f"{what}: last rows")


def _seams_match(got: np.ndarray, img: np.ndarray, reference, halo: int, band_rows: int,
                 what: str) -> None:  # fmt: skip
    """got's BAND rows on each side of every seam between the device's row bands (every
    `band_rows` rows) equal reference() of those rows with halo rows around them."""
    for seam in range(band_rows, img.shape[0], band_rows):
        want = reference(img[seam - BAND - halo : seam + BAND + halo])[halo:-halo]
        np.testing.assert_array_equal(got[seam - BAND : seam + BAND], want,
                                      err_msg=f"{what}: rows at {seam}")  # fmt: skip


CASES = {
    "blur 5": (lambda d: imgfilter.blur(d, 5), lambda a: ref.blur(a, 5), 2),
    "blur 21": (lambda d: imgfilter.blur(d, 21), lambda a: ref.blur(a, 21), 10),
    "filter2d 3x3": (lambda d: imgfilter.filter2d(d, KERNEL), lambda a: ref.filter2d(a, KERNEL), 1),
    "filter2d naive": (
        lambda d: imgfilter.filter2d(d, KERNEL, method="naive"),
        lambda a: ref.filter2d(a, KERNEL),
        1,
    ),
    "contour": (lambda d: imgfilter.contour(d), lambda a: ref.contour(a), 1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("channels", sorted(SHAPES))
def test_more_than_2_31_elements(channels):
    cp = pytest.importorskip("cupy")
    shape = SHAPES[channels]
    assert np.prod(shape) > 2**31
    img = _huge(shape)
    d = cp.asarray(img)
    for name, (ours, reference, halo) in CASES.items():
        got = ours(d)
        assert got.shape == (shape if name != "contour" else shape[:2])
        host = got.get()
        del got
        _ends_match(host, img, reference, halo, f"{name}, {channels} channel(s)")
        bands = backend.MAX_GRID_ROWS
        if name.startswith("blur"):
            k = int(name.split()[1])
            bands = backend._box_band_rows(img.reshape(*shape[:2], -1).shape, img.dtype, (k, k),
                                           (halo, halo))  # fmt: skip
            band = (bands + 2 * halo, *img.reshape(*shape[:2], -1).shape[1:])
            assert box_method(band, np.uint8, (k, k)) == "tiled", name  # not box_fused
        _seams_match(host, img, reference, halo, bands, f"{name}, {channels} channel(s)")
        del host
