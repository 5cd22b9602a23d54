"""Normalized box filters (cv2.blur semantics): the entry point, `box_auto`.

Images are (H, W, C) device arrays of uint8, uint16 or float32; the output has the
input's dtype. out[y, x, c] = (sum of the kh x kw box whose anchor (ay, ax) sits on
(y, x)) / (kh * kw), borders by `kernels.common.border_index` code, `cval` the
constant-border value (already cast to the image's dtype). Integer outputs are
rounded half to even and saturated. Sums are exact for integer images (integer or
float64 registers, stored narrower only where that is exact) and the division is
correctly rounded, so the result is round(sum / area) exactly. cv2.blur equals that
except where its 8-bit fixed-point path for boxes of at most 257 pixels rounds
differently (it is off by one at some ties, e.g. a 2x1 box of zeros gives 1).

Six implementations, and `box_auto` choosing among them (`box_method`, which asks
`kernels.box.plan.choose`):
- `box_tiled` (module `kernels.box.tiled`): uint8 images, one shared-memory tile per
  block in three phases (load the tile and halo, horizontal row sums, vertical sums
  written out). The fastest measured for boxes up to `kernels.box.plan.TILED_MAX_BOX`
  (31) on a side; `box_auto` uses it there wherever its tile holds the box and the
  image starts on a 4-byte boundary (`box_choice`).
- `box_twopass` (module `kernels.box.twopass`): uint8 images, a row pass of sliding
  sums into a 16-bit scratch, then a column pass of running sums and means. `box_auto`
  uses it for larger uint8 boxes up to 257 columns (faster than box_fused there on
  the H100) where the image starts on a 4-byte boundary.
- `box_fused` (module `kernels.box.fused`): one pass for uint8/uint16 images,
  vertical running sums in registers and horizontal sliding sums in shared memory.
  `box_auto` uses it for uint16 images and for the uint8 cases the two above decline,
  wherever its tile holds the box.
- `box_packed` (module `kernels.box.packed`): box_fused's design for uint8 images
  reading 32-bit words, two column sums per add; boxes up to 257 rows. Slower than
  box_fused on the H100 so far; `box_auto` uses it for uint8 boxes that the others
  decline.
- `box_separable` and `box_running` (module `kernels.box.running`): a row pass and a
  column pass through a scratch image (cost per pixel grows with k), and running
  sums (a column pass, then a row pass; cost per pixel barely depends on k).

The first four are launched from `kernels.box.launch`, the last two from
`kernels.box.running`: both name their kernels by `kernels.common.refs.KernelRef`,
so importing this module imports no Numba (a kernel's module, and Numba, are
imported only where its binary neither ships nor is cached).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..common.arrays import start_address
from . import plan
from .launch import box_fused, box_packed, box_tiled, box_twopass
from .running import box_running, box_separable


@lru_cache(maxsize=64)
def _plans(shape: tuple, dtype: np.dtype, ksize: tuple) -> tuple[str, dict | None]:
    return plan.choose(shape, dtype, ksize)


def box_method(shape: tuple, dtype, ksize: tuple) -> str:
    """The implementation `box_auto` takes (`kernels.box.plan.choose`): "tiled" (uint8
    boxes up to TILED_MAX_BOX on a side that its tile holds), "twopass" (larger uint8
    boxes up to 257 columns), "fused" (uint8/uint16 boxes that fit its tile), "packed"
    (uint8 boxes up to 257 rows that the others decline) or "running"."""
    return _plans(tuple(shape), np.dtype(dtype), tuple(ksize))[0]


def box_choice(img, ksize: tuple, out=None) -> tuple[str, dict | None]:
    """(method, geometry) `box_auto` runs for this device image (and output, if given):
    `box_method`'s choice, except that an image whose first byte is not 4-byte aligned
    (a view such as d[1:] of an odd-width uint8 image) goes to box_fused (or
    box_running), because box_tiled, box_packed and box_twopass read it as 32-bit words; so does
    such an output where the kernel writes words (box_packed, box_tiled columns
    first)."""
    method, geometry = _plans(tuple(img.shape), np.dtype(img.dtype), tuple(ksize))
    writes_words = method in ("packed", "tiled")
    misaligned = start_address(img) % 4 or (
        out is not None and writes_words and start_address(out) % 4
    )
    if method in ("tiled", "packed", "twopass") and misaligned:
        fused = plan.plan(tuple(img.shape), img.dtype, tuple(ksize))
        return ("fused", fused) if fused is not None else ("running", None)
    return method, geometry


_RUNNERS = {
    "tiled": box_tiled,
    "packed": box_packed,
    "fused": box_fused,
    "twopass": box_twopass,
}


def box_auto(img, ksize, anchor, mode, cval, out=None, stream: int = 0):
    """The fastest exact box filter for the case (see `box_choice`): `box_tiled`,
    `box_twopass`, `box_fused`, `box_packed` or `box_running`, queued on `stream`.
    Same contract as all."""
    method, geometry = box_choice(img, ksize, out)
    run = _RUNNERS.get(method)
    if run is None:
        return box_running(img, ksize, anchor, mode, cval, out, stream)
    return run(img, ksize, anchor, mode, cval, out, geometry, stream)


class MethodRefused(ValueError):
    """A box kernel asked for by name does not take the case."""


# The box kernels a name can ask for that take only what their plan accepts: name ->
# (plan, kernel, whether it reads the image (and tiled/packed write the result) as
# 32-bit words, so both must start on a 4-byte boundary).
_PLANNED = {
    "tiled": (plan.tiled_plan, box_tiled, True),
    "twopass": (plan.twopass_plan, box_twopass, True),
    "fused": (plan.plan, box_fused, False),
    "packed": (plan.packed_plan, box_packed, True),
}


def box_by_name(method: str):
    """The box filter `method` names, as run(img, ksize, anchor, mode, cval, out,
    stream): "auto" (`box_auto`), "separable", "running", or a planned kernel
    ("tiled", "twopass", "fused", "packed"), which raises MethodRefused for a case its
    plan does not take."""
    if method == "auto":
        return box_auto
    if method == "separable":
        return box_separable
    if method == "running":
        return box_running
    planner, kernel, words = _PLANNED[method]

    def run(img, ksize, anchor, mode, cval, out=None, stream: int = 0):
        geometry = planner(tuple(img.shape), img.dtype, tuple(ksize))
        if geometry is None:
            raise MethodRefused(
                f"blur method {method!r} does not take a {'x'.join(map(str, img.shape))} "
                f"{np.dtype(img.dtype).name} image with a {ksize[1]}x{ksize[0]} box; "
                "method auto takes any"
            )
        misaligned = start_address(img) % 4 or (out is not None and start_address(out) % 4)
        if words and misaligned:
            raise MethodRefused(f"blur method {method!r} reads 32-bit words: the image and "
                                "the result must start on a 4-byte boundary")  # fmt: skip
        return kernel(img, ksize, anchor, mode, cval, out, geometry, stream)

    return run


# ------------------------------------------------------------- bands and stand-ins

# The fast uint8 box kernels (box_tiled, box_twopass, box_packed) address images of
# fewer than FAST_BOX_BYTES bytes; box_auto gives larger ones to box_fused, which ran
# about half as fast on an H200 (benchmarks/tall_device.py). Such images are boxed in
# bands of rows of at most BOX_BAND_BYTES instead: box_twopass's 16-bit scratch is
# twice a band.
FAST_BOX_BYTES = 2**31
BOX_BAND_BYTES = 2**29


def band_rows(shape: tuple, dtype, ksize: tuple, rows: tuple, most: int) -> int | None:
    """Rows per band for box_auto on an (H, W, C) image of at least FAST_BOX_BYTES,
    rows = (above, below) its box's reach, bands of at most `most` rows: bands of at
    most BOX_BAND_BYTES with their reach, at least 8 times the reach (so that the rows
    filtered twice stay few), where the fast kernels take them; None where the image
    needs no bands of its own."""
    h, w, c = shape
    if np.dtype(dtype) != np.uint8 or h * w * c < FAST_BOX_BYTES:
        return None
    reach = rows[0] + rows[1]
    band = min(most, BOX_BAND_BYTES // (w * c) - reach)
    if band < 8 * max(reach, 1):
        return None
    faster = box_method((band + reach, w, c), dtype, ksize) != box_method(shape, dtype, ksize)
    return band if faster else None


def stand_in(img, ksize: tuple, out=None) -> tuple[str, str] | None:
    """(the kernel box_auto picks, its stand-in) for a device image (a batch: its first
    image decides) and optional output, where auto's kernel is specialised for its box
    size (compiled per size: `kernels.box.plan.STAND_IN`) and the stand-in takes every
    image and the output; None elsewhere."""
    one = img if len(img.shape) == 3 else img[0]
    method, _ = box_choice(one, ksize, out)
    standing = plan.STAND_IN.get(method)
    if standing is None:
        return None
    starts = [start_address(one)] + ([] if out is None else [start_address(out)])
    steps = [a.strides[0] for a in (img, out) if a is not None and len(a.shape) == 4]
    shape, dtype = tuple(one.shape), np.dtype(one.dtype)
    for at in starts + steps:
        if not plan.stand_in_takes(standing, shape, dtype, tuple(ksize), at):
            return None
    return method, standing
