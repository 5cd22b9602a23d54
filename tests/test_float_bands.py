"""A float32 host image whose box is taller than its bands, filtered in bands through
the GPU (issue 55: `blur(img, (257, 257), border="replicate", backend="cuda")` of a
4320x7680 float32 host image raised a TypeError in the quick start's result copy)."""

from __future__ import annotations

import cv2
import numpy as np

import imgfilter
from imgfilter import streamed


def test_float32_box_taller_than_its_bands_matches_opencv(monkeypatch):
    rng = np.random.default_rng(55)
    img = (rng.standard_normal((37, 23)) * 100).astype(np.float32)
    want = cv2.blur(img, (17, 21), borderType=cv2.BORDER_REPLICATE)
    whole = imgfilter.blur(img, (17, 21), border="replicate", backend="cuda")
    np.testing.assert_allclose(whole, want, rtol=1e-5, atol=1e-3)
    # max_gpu_bytes below one call's need: bands of a few rows, each with 20 rows of halo.
    plans, real_plan = [], streamed.band_plan
    monkeypatch.setattr(streamed, "band_plan", lambda *a: plans.append(real_plan(*a)) or plans[-1])
    banded = imgfilter.blur(img, (17, 21), border="replicate", backend="cuda",
                            max_gpu_bytes=4000)  # fmt: skip
    np.testing.assert_array_equal(banded, whole)
    out = np.zeros_like(img)
    assert imgfilter.blur(img, (17, 21), border="replicate", backend="cuda",
                          max_gpu_bytes=4000, out=out) is out  # fmt: skip
    np.testing.assert_array_equal(out, whole)
    assert len(plans) == 2 and all(len(plan) >= 3 for plan in plans), plans
