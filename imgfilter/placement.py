"""Where a host image is filtered: the one rule of the command line and the batch API.

The rule (`cpu_bytes`, `on_cpu`): with backend "auto" and method "auto", a host
(NumPy) image goes to the CPU backend when its filter is cheap there, at most CHEAP_NS
nanoseconds a value (pixel x channel) on one core (`cpu_ns_per_value`: integer boxes,
contour, filter2d up to 15 taps), and the image holds at most `cpu_limit(op)` bytes
(`backends.warmup`: 128 MiB, a blur 40 MiB per CPU when that is more). Every other
image goes to the backend asked for: "auto" then means the GPU where there is one. A
backend named outright is obeyed ("cpu": every image on the CPU, "cuda": none), and so
is a method other than "auto" (it names a CUDA kernel). Both backends give OpenCV's
results, so the outputs are the same wherever an image goes.

Why: a cheap filter goes through memory on the CPU about as fast as the GPU route
moves the image across the bus and back, so the GPU's copies, launches and hand-offs
only add time; and next to decoding and encoding a JPEG (4.4 ns a value) such a filter
takes under a third of a codec thread's time, as in a plain cv2 thread pool. Costlier
filters (filter2d from 16 taps, float32 boxes) repay the GPU route. Past the size
limit, the GPU (its copies overlapping the work, `imgfilter.streamed`) beats the CPU's
passes even for a cheap filter.

Callers: `imgfilter.batch` (each host image of a batch; those on the CPU go over every
CPU at once), the command line's one image (`cli.filtering.filter_file`, before any
GPU is started: `first_image_on_cpu`, the size limit alone), and its folders
(`cli.filtering`: an image on the CPU is filtered on the codec thread that decoded it,
the others on the resolved backend in filter threads).

Imports nothing (no NumPy, Numba or CUDA) beyond `backends.warmup`.
"""

from __future__ import annotations

import sys
from typing import Any

from .backends import warmup

# The CPU backend's time per value on one core, measured on 2495x2167 RGB uint8 photos
# (OpenCV 5.0, benchmarks/many_files_cv2.py --costs): decoding and encoding that JPEG
# (quality 92 in, 95 out) 4.4 ns a value (decoding alone 2.8); a box of an integer image
# (cv2.blur's running sums) 0.4 (k=3) to 1.1 (k=21), uint16 1.2; a float32 box
# (float64 sums in NumPy) 13; contour 1.5 (OpenCV) to 1.7 (Numba's pass); filter2d
# 0.11-0.13 per kernel tap from 3x3 to 11x11 (cv2.filter2D's direct sums: 3x3 1.2, 5x5
# 3.0), 28 at 21x21 (its larger kernels go to FFT tiles or compiled loops).
BOX_NS = 1.2
FLOAT_BOX_NS = 13.0
CONTOUR_NS = 1.7
TAP_NS = 0.13
# Half the JPEG codecs' cost: integer boxes, contour and filter2d up to 15 taps are
# cheap; filter2d from 16 taps (4x4) and float32 boxes are not.
CHEAP_NS = 2.0


def cpu_ns_per_value(op: str, dtype: Any, taps: int = 0) -> float:
    """The CPU backend's estimated time for `op` ("blur", "contour", else filter2d with
    `taps` kernel taps) per value of an image of NumPy dtype `dtype`, on one core."""
    if op == "blur":
        return BOX_NS if dtype.kind in "ui" else FLOAT_BOX_NS
    if op == "contour":
        return CONTOUR_NS
    return TAP_NS * taps


def cpu_bytes(op: str, dtype: Any, backend: str = "auto", method: str = "auto",
              taps: int = 0) -> int:  # fmt: skip
    """The most bytes a host image of `dtype` may hold for `op` (with `taps`, for
    filter2d) to be filtered by the CPU backend when `backend` and `method` were asked
    (the module docstring's rule); 0: none, whatever its size."""
    backend, method = str(backend).lower(), str(method).lower()
    if backend == "cpu":
        return sys.maxsize
    if backend != "auto" or method != "auto" or cpu_ns_per_value(op, dtype, taps) > CHEAP_NS:
        return 0
    return warmup.cpu_limit(op)


def first_image_on_cpu(op: str, img: Any) -> bool:
    """Whether the command line's one host image, read while no GPU has been started
    (`warmup.one_image_on_cpu` said its file may go to the CPU), is filtered by the CPU
    backend: whenever it holds at most `cpu_limit(op)` bytes, whatever its filter's
    cost. Opening a CUDA context and loading kernels takes 0.3-0.5 s, longer than the
    CPU takes for any filter of an image that size (a float32 box of 600x512 in about
    0.05 s), so the cost rule of `on_cpu` applies only once a GPU is running."""
    return img.nbytes <= warmup.cpu_limit(op)


def on_cpu(op: str, img: Any, backend: str = "auto", method: str = "auto",
           taps: int = 0) -> bool:  # fmt: skip
    """Whether host image `img` (a NumPy array) is filtered by the CPU backend (the
    module docstring's rule; `cpu_bytes`)."""
    limit = cpu_bytes(op, img.dtype, backend, method, taps)
    return limit > 0 and img.nbytes <= limit
