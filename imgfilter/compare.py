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

    Attributes:
        max_abs_diff: The largest absolute difference of the elements, as float64 (0 for
            empty images).
        mean_abs_diff: The mean absolute difference of the elements, as float64 (0 for
            empty images).
        psnr_db: Peak signal-to-noise ratio, math.inf when identical; the peak is the
            dtype's maximum for unsigned images, else max(1, max|reference|).
        tolerance: The largest max_abs_diff that agrees.
        tolerance_rule: The rule that gave the tolerance, in words.
    """

    max_abs_diff: float
    mean_abs_diff: float
    psnr_db: float
    tolerance: float
    tolerance_rule: str

    @property
    def agree(self) -> bool:
        """True when the results agree, that is max_abs_diff is within the tolerance."""
        return self.max_abs_diff <= self.tolerance

    @property
    def identical(self) -> bool:
        """True when the results are equal element for element (max_abs_diff is 0)."""
        return self.max_abs_diff == 0.0


def tolerance(img: Any, kernel: Any) -> tuple[float, str]:
    """How far imgfilter may stray from OpenCV filtering `img` with `kernel`.

    The rules (docs/design.md, "Agreement with OpenCV"): exact for an integer kernel on
    an integer image, 1 LSB for another kernel on an integer image, and
    1e-5 * max(1, sum|kernel| * max|img|) for float32 images.

    Args:
        img: The filtered image (a NumPy array; its dtype and values are used).
        kernel: The kernel; for a box blur, its K x K kernel of 1/K^2; for contour, any
            integer kernel.

    Returns:
        (bound, rule): the bound on the max abs difference, and the rule that gave it.

    Example:
        >>> import numpy as np
        >>> from imgfilter import compare
        >>> img = np.zeros((4, 4), np.uint8)
        >>> compare.tolerance(img, np.ones((3, 3)) / 9)
        (1.0, '1 LSB: non-integer kernel on an integer image')
    """
    k = np.asarray(kernel, dtype=np.float64)
    if img.dtype.kind == "f":
        scale = float(np.abs(k).sum()) * float(np.abs(img).max(initial=0.0))
        return 1e-5 * max(1.0, scale), "1e-5 * max(1, sum|kernel| * max|img|) for float32 images"
    if np.array_equal(k, np.round(k)):
        return 0.0, "exact: integer kernel on an integer image"
    return 1.0, "1 LSB: non-integer kernel on an integer image"


def psnr_db(mse: float, peak: float) -> float:
    """Peak signal-to-noise ratio in decibels.

    Args:
        mse: The mean squared error.
        peak: The peak value (for example 255 for uint8 images).

    Returns:
        10 log10(peak^2 / mse), math.inf for mse 0.

    Example:
        >>> from imgfilter import compare
        >>> round(compare.psnr_db(1.0, 255.0), 2)
        48.13
    """
    return math.inf if mse == 0.0 else 10.0 * math.log10(peak * peak / mse)


def agreement(out: Any, ref: Any, img: Any, kernel: Any) -> Agreement:
    """Compare imgfilter's result with OpenCV's.

    Args:
        out: imgfilter's result on `img`, a host array.
        ref: OpenCV's result, a host array of out's shape.
        img: The filtered image (its dtype picks the PSNR peak and the tolerance).
        kernel: As for `tolerance`.

    Returns:
        An `Agreement`: max and mean abs difference, PSNR, tolerance and its rule.

    Example:
        >>> import cv2
        >>> import numpy as np
        >>> import imgfilter
        >>> from imgfilter import compare
        >>> img = np.random.default_rng(0).integers(0, 256, (64, 64), np.uint8)
        >>> a = compare.agreement(imgfilter.blur(img, 5), cv2.blur(img, (5, 5)), img,
        ...                       np.full((5, 5), 1 / 25))
        >>> a.agree, a.tolerance
        (True, 1.0)
    """
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
