"""How far imgfilter's result is from OpenCV's, and how far it may be.

    a = compare.agreement(ours, reference, img, kernel)
    a.max_abs_diff, a.mean_abs_diff, a.psnr_db, a.tolerance, a.agree

The tolerance follows docs/design.md ("Agreement with OpenCV"): exact for an integer
kernel on an integer image, 1 LSB for another kernel on an integer image, and
1e-5 * max(1, sum|kernel| * max|img|) for float32 images. `imgfilter compare` prints
these figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Agreement:
    """The differences between two results and the verdict.

    max_abs_diff, mean_abs_diff: of the elements, as float64 (0 for empty images).
    psnr_db: peak signal-to-noise ratio, math.inf when identical; the peak is the
    dtype's maximum for unsigned images, else max(1, max|reference|).
    tolerance, tolerance_rule: the largest max_abs_diff that agrees, and why.
    """

    max_abs_diff: float
    mean_abs_diff: float
    psnr_db: float
    tolerance: float
    tolerance_rule: str

    @property
    def agree(self) -> bool:
        """The results agree: max_abs_diff is within the tolerance."""
        return self.max_abs_diff <= self.tolerance

    @property
    def identical(self) -> bool:
        return self.max_abs_diff == 0.0


def tolerance(img: Any, kernel: Any) -> tuple[float, str]:
    """How far imgfilter may stray from OpenCV filtering `img` with `kernel` (for a box
    blur, its K x K kernel of 1/K^2; for contour, any integer kernel): the bound on the
    max abs difference and the rule that gave it."""
    k = np.asarray(kernel, dtype=np.float64)
    if img.dtype.kind == "f":
        scale = float(np.abs(k).sum()) * float(np.abs(img).max(initial=0.0))
        return 1e-5 * max(1.0, scale), "1e-5 * max(1, sum|kernel| * max|img|) for float32 images"
    if np.array_equal(k, np.round(k)):
        return 0.0, "exact: integer kernel on an integer image"
    return 1.0, "1 LSB: non-integer kernel on an integer image"


def psnr_db(mse: float, peak: float) -> float:
    """10 log10(peak^2 / mse), math.inf for mse 0."""
    return math.inf if mse == 0.0 else 10.0 * math.log10(peak * peak / mse)


def agreement(out: Any, ref: Any, img: Any, kernel: Any) -> Agreement:
    """Compare `out` (imgfilter's result on `img`) with `ref` (OpenCV's), both host
    arrays of one shape; `kernel` as for `tolerance`."""
    diff = np.abs(np.asarray(out, dtype=np.float64) - np.asarray(ref, dtype=np.float64))
    max_diff = float(diff.max(initial=0.0))
    mean_diff = float(diff.mean()) if diff.size else 0.0
    mse = float(np.mean(diff * diff)) if diff.size else 0.0
    if img.dtype.kind == "u":
        peak = float(np.iinfo(img.dtype).max)
    else:
        peak = max(1.0, float(np.abs(ref).max(initial=0.0)))
    tol, rule = tolerance(img, kernel)
    return Agreement(max_diff, mean_diff, psnr_db(mse, peak), tol, rule)
