"""The array API's checks of option values: each bad form is a UsageError that names
the accepted forms (issue: `blur(img, (3,))` raised a bare ValueError, `blur(img, True)`
ran as k=1, `blur(img, "5")` said "got 5")."""

from __future__ import annotations

import numpy as np
import pytest

import imgfilter
from imgfilter import UsageError

IMG = np.arange(1, 50, dtype=np.uint8).reshape(7, 7)


@pytest.mark.parametrize("k", [(3,), (3, 5, 7), True, False, "5", (3, "a"), [[3]], 2.5, None])
def test_blur_refuses_kernel_size_forms_naming_the_accepted_ones(k):
    imgfilter.blur(IMG, 1, backend="cpu")  # True == 1 must not reuse this call's options
    with pytest.raises(UsageError, match=r"int side k, or OpenCV's \(width, height\)") as err:
        imgfilter.blur(IMG, k, backend="cpu")
    assert repr(k) in str(err.value)


@pytest.mark.parametrize("k", [0, -3, (0, 3), (3, -1)])
def test_blur_refuses_sides_below_one(k):
    with pytest.raises(UsageError, match="must be positive"):
        imgfilter.blur(IMG, k, backend="cpu")


@pytest.mark.parametrize("k", [3, (3, 3), [3, 3], np.int64(3), 3.0, np.array([3, 3])])
def test_blur_takes_int_sides_and_pairs(k):
    want = imgfilter.blur(IMG, 3, backend="cpu")
    assert np.array_equal(imgfilter.blur(IMG, k, backend="cpu"), want)


def test_blur_pair_is_width_then_height():
    got = imgfilter.blur(IMG, (5, 1), backend="cpu")
    rows = np.array([np.convolve(np.pad(r.astype(float), 2, mode="reflect"), np.ones(5) / 5,
                                 "valid") for r in IMG])  # fmt: skip
    assert np.abs(got.astype(float) - rows).max() <= 0.5 + 1e-9
